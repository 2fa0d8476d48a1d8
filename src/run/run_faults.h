// A run's fault injection (core/fault_injection.h, a test hook): the
// injector made from its fault_injection= key, and the scope every rank
// thread of the run installs, so that the spec reaches this run's ranks and
// no other layer or run of the process.
//
// ACTION stop, per transport: a process per rank (mpirun) stops itself
// (SIGSTOP), as a hung process would. Ranks as threads share one process, so
// there the stopped rank's thread alone stops answering: it waits, taking
// part in nothing, until a peer gives up on it (a wait times out after
// comm_timeout_ms and aborts the world) or, when no rank ever waits for it,
// for 2 x comm_timeout_ms; either way the run's error names it
// (FaultInjector::rethrow_naming_stopped_rank).
#pragma once

#include <chrono>
#include <memory>

#include "core/fault_injection.h"
#include "run/config_keys.h"
#include "transport/communicator.h"

namespace epmoe::run {

enum class FaultSpecSource {
  key,                 // fault_injection= only (a library object: its own keys)
  key_or_environment,  // else EPMOE_FAULT_INJECTION (the epmoe commands; mpirun -x)
};

// The injector for a run of `num_ranks` ranks, nullptr when no spec is
// given. ConfigError naming the key and the rule: a malformed spec, an empty
// key, a RANK the run does not have, ACTION stop with one rank (no peer
// could notice: it would hang).
std::unique_ptr<FaultInjector> fault_injector_from(const ConfigValues& values, int num_ranks, FaultSpecSource source);

// Installed by each rank thread of a run for the rank's work (a no-op scope
// when `injector` is null). `comm` is the rank's communicator (nullptr for a
// single rank without one); `timeout` the run's comm_timeout_ms.
class RankFaultScope {
 public:
  RankFaultScope(FaultInjector* injector, transport::Communicator* comm, std::chrono::milliseconds timeout);

 private:
  FaultScope scope_;
};

}  // namespace epmoe::run
