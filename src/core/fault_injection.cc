#include "core/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace epmoe {
namespace {

enum class FaultAction { throw_error, kill, stop };

struct FaultSpec {
  int rank = -1;
  std::string point;
  FaultAction action = FaultAction::throw_error;
  long nth = 1;
  std::string text;
};

struct FaultState {
  std::mutex mutex;  // guards everything below
  bool from_environment_read = false;
  FaultSpec spec;
  std::map<std::pair<int, std::string>, long> hits;  // (rank, point) -> times reached
};

FaultState& state() {
  static FaultState fault_state;
  return fault_state;
}

// True while a spec is set: the fast path of fault_point reads only this.
std::atomic<int> g_configured{-1};  // -1: environment not read yet, 0: none, 1: set

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

FaultSpec parse(std::string_view text) {
  FaultSpec spec;
  spec.text = std::string(text);
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  for (;;) {
    const std::size_t colon = text.find(':', start);
    fields.push_back(text.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start));
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  if (fields.size() < 2 || fields.size() > 4) bad_spec(text, "needs 2 to 4 fields separated by ':'");
  spec.rank = static_cast<int>(parse_non_negative(text, fields[0], "RANK"));
  if (fields[1].empty()) bad_spec(text, "POINT is empty");
  spec.point = std::string(fields[1]);
  if (fields.size() >= 3) {
    if (fields[2] == "throw") {
      spec.action = FaultAction::throw_error;
    } else if (fields[2] == "kill") {
      spec.action = FaultAction::kill;
    } else if (fields[2] == "stop") {
      spec.action = FaultAction::stop;
    } else {
      bad_spec(text, "ACTION must be throw, kill or stop, not '" + std::string(fields[2]) + "'");
    }
  }
  if (fields.size() == 4) {
    spec.nth = parse_non_negative(text, fields[3], "NTH");
    if (spec.nth < 1) bad_spec(text, "NTH must be >= 1");
  }
  return spec;
}

void set_locked(FaultState& s, std::string_view text) {
  s.hits.clear();
  if (text.empty()) {
    s.spec = FaultSpec{};
    g_configured.store(0, std::memory_order_release);
    return;
  }
  s.spec = parse(text);
  g_configured.store(1, std::memory_order_release);
}

void read_environment_locked(FaultState& s) {
  if (s.from_environment_read) return;
  s.from_environment_read = true;
  const char* text = std::getenv("EPMOE_FAULT_INJECTION");
  set_locked(s, text != nullptr ? std::string_view(text) : std::string_view());
}

}  // namespace

void configure_fault_injection(std::string_view spec) {
  FaultState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.from_environment_read = true;  // an explicit spec wins over the environment
  set_locked(s, spec);
}

std::string fault_injection_spec() {
  FaultState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  read_environment_locked(s);
  return s.spec.text;
}

void fault_point(std::string_view point, int rank) {
  if (g_configured.load(std::memory_order_acquire) == 0) return;
  FaultState& s = state();
  FaultAction action;
  std::string text;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    read_environment_locked(s);
    if (s.spec.text.empty() || s.spec.rank != rank || s.spec.point != point) return;
    if (++s.hits[{rank, std::string(point)}] != s.spec.nth) return;
    action = s.spec.action;
    text = s.spec.text;
  }
  const std::string what =
      "rank " + std::to_string(rank) + ": injected fault at " + std::string(point) + " (fault_injection=" + text + ")";
  switch (action) {
    case FaultAction::throw_error:
      throw InjectedFault(what);
    case FaultAction::kill:
      std::cerr << "epmoe: " << what << ": SIGKILL" << std::endl;
      ::kill(::getpid(), SIGKILL);
      break;
    case FaultAction::stop:
      std::cerr << "epmoe: " << what << ": SIGSTOP" << std::endl;
      ::kill(::getpid(), SIGSTOP);
      break;
  }
}

}  // namespace epmoe
