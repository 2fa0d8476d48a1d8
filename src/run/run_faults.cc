#include "run/run_faults.h"

#include <string>
#include <thread>

namespace epmoe::run {
namespace {

// A tag no collective uses (comm/tag.h: collective kinds are 0..6 in the top
// four bits; this is kind 15), for the stopped rank's receive that nobody
// ever sends to.
constexpr transport::Tag kStoppedRankTag = transport::kMaxTag;

// Ranks as threads: this rank stops answering. It waits for nobody (so a
// peer's timeout names it as the rank the others are stuck behind) and
// polls a receive that never matches, which fails once the world is aborted.
void stop_rank_thread(transport::Communicator& comm, std::chrono::milliseconds timeout, const std::string& what) {
  const std::unique_ptr<transport::Request> never = comm.irecv(comm.rank(), kStoppedRankTag, nullptr, 0);
  const transport::Deadline deadline = transport::Clock::now() + 2 * timeout;
  while (transport::Clock::now() < deadline) {
    never->test();  // AbortedError once a peer gave up on this rank
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  throw InjectedFault(what + ": stopped, and no rank waited for it within 2 x comm_timeout_ms (" +
                      std::to_string(timeout.count()) + " ms)");
}

FaultScope::StopRank stop_rank_for(transport::Communicator* comm, std::chrono::milliseconds timeout) {
  if (comm == nullptr || comm->transport_name() != "threads") return {};  // a process per rank: SIGSTOP
  return [comm, timeout](const std::string& what) { stop_rank_thread(*comm, timeout, what); };
}

}  // namespace

std::unique_ptr<FaultInjector> fault_injector_from(const ConfigValues& values, int num_ranks, FaultSpecSource source) {
  std::string spec;
  if (values.is_set("fault_injection")) {
    spec = values.get_string("fault_injection");
    if (spec.empty()) {
      throw ConfigError("fault_injection='': empty; give RANK:POINT[:throw|kill|stop[:NTH]] or leave the key out");
    }
  } else if (source == FaultSpecSource::key_or_environment) {
    spec = fault_injection_from_environment();
    if (spec.empty()) return nullptr;
  } else {
    return nullptr;
  }
  auto injector = std::make_unique<FaultInjector>(spec);  // ConfigError naming the key and the rule
  // A rank the run does not have would never fail: the test would pass
  // without testing anything.
  if (injector->rank() >= num_ranks) {
    throw ConfigError("fault_injection=" + spec + ": RANK " + std::to_string(injector->rank()) +
                      " is not a rank of this run (ranks=" + std::to_string(num_ranks) + ")");
  }
  if (injector->action() == FaultInjector::Action::stop && num_ranks < 2) {
    throw ConfigError("fault_injection=" + spec +
                      ": stop needs ranks >= 2 (a stopped rank is found by its peers' timeouts; alone it would "
                      "hang); use throw or kill");
  }
  return injector;
}

RankFaultScope::RankFaultScope(FaultInjector* injector, transport::Communicator* comm,
                               std::chrono::milliseconds timeout)
    : scope_(injector, injector != nullptr ? stop_rank_for(comm, timeout) : FaultScope::StopRank{}) {}

}  // namespace epmoe::run
