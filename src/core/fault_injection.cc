#include "core/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <vector>

namespace epmoe {
namespace {

thread_local const FaultScope* tls_fault_scope = nullptr;

[[noreturn]] void bad_spec(std::string_view spec, const std::string& rule) {
  throw ConfigError("fault_injection = '" + std::string(spec) + "': " + rule +
                    " (expected RANK:POINT[:throw|kill|stop[:NTH]], docs/RELIABILITY.md)");
}

long parse_non_negative(std::string_view spec, std::string_view field, const char* what) {
  if (field.empty() || field.size() > 9) bad_spec(spec, std::string(what) + " must be a number");
  long value = 0;
  for (char c : field) {
    if (c < '0' || c > '9') bad_spec(spec, std::string(what) + " must be a number, not '" + std::string(field) + "'");
    value = value * 10 + (c - '0');
  }
  return value;
}

}  // namespace

FaultInjector::FaultInjector(std::string_view text) : spec_(text) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  for (;;) {
    const std::size_t colon = text.find(':', start);
    fields.push_back(text.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start));
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  if (fields.size() < 2 || fields.size() > 4) bad_spec(text, "needs 2 to 4 fields separated by ':'");
  rank_ = static_cast<int>(parse_non_negative(text, fields[0], "RANK"));
  if (fields[1].empty()) bad_spec(text, "POINT is empty");
  point_ = std::string(fields[1]);
  if (fields.size() >= 3) {
    if (fields[2] == "throw") {
      action_ = Action::throw_error;
    } else if (fields[2] == "kill") {
      action_ = Action::kill;
    } else if (fields[2] == "stop") {
      action_ = Action::stop;
    } else {
      bad_spec(text, "ACTION must be throw, kill or stop, not '" + std::string(fields[2]) + "'");
    }
  }
  if (fields.size() == 4) {
    nth_ = parse_non_negative(text, fields[3], "NTH");
    if (nth_ < 1) bad_spec(text, "NTH must be >= 1");
  }
}

bool FaultInjector::fires(std::string_view point, int rank) {
  if (rank != rank_ || point != point_) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  return ++hits_[{rank, std::string(point)}] == nth_;
}

std::string FaultInjector::describe() const {
  return "rank " + std::to_string(rank_) + ": injected fault at " + point_ + " (fault_injection=" + spec_ + ")";
}

void FaultInjector::rethrow_naming_stopped_rank(std::exception_ptr error) {
  bool stopped = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped = std::exchange(stopped_, false);
  }
  if (!stopped) std::rethrow_exception(error);
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find(describe()) != std::string::npos) throw;  // names it already
    throw PeerError(what + "; rank " + std::to_string(rank_) + " had stopped at " + point_ +
                    " (fault_injection=" + spec_ + ")");
  }
}

std::string fault_injection_from_environment() {
  const char* text = std::getenv("EPMOE_FAULT_INJECTION");
  return text != nullptr ? std::string(text) : std::string();
}

FaultScope::FaultScope(FaultInjector* injector, StopRank stop_rank)
    : injector_(injector), stop_rank_(std::move(stop_rank)), previous_(set_this_thread_fault_scope(this)) {}

FaultScope::~FaultScope() { set_this_thread_fault_scope(previous_); }

const FaultScope* this_thread_fault_scope() { return tls_fault_scope; }

const FaultScope* set_this_thread_fault_scope(const FaultScope* scope) {
  const FaultScope* previous = tls_fault_scope;
  tls_fault_scope = scope;
  return previous;
}

void fault_point(std::string_view point, int rank) {
  const FaultScope* scope = tls_fault_scope;
  if (scope == nullptr || scope->injector() == nullptr) return;
  FaultInjector& injector = *scope->injector();
  if (!injector.fires(point, rank)) return;
  const std::string what = injector.describe();
  switch (injector.action()) {
    case FaultInjector::Action::throw_error:
      throw InjectedFault(what);
    case FaultInjector::Action::kill:
      std::cerr << "epmoe: " << what << ": SIGKILL" << std::endl;
      ::kill(::getpid(), SIGKILL);
      break;
    case FaultInjector::Action::stop:
      injector.mark_stopped();
      if (scope->stop_rank()) {
        scope->stop_rank()(what);
      } else {
        std::cerr << "epmoe: " << what << ": SIGSTOP" << std::endl;
        ::kill(::getpid(), SIGSTOP);
      }
      break;
  }
}

}  // namespace epmoe
