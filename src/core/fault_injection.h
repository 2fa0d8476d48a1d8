// Fault injection: a test hook, documented as such (docs/RELIABILITY.md),
// that makes rank r of one run fail at a named point of its work so the tests
// can show that a failure on one rank reaches every rank at once.
//
// Spec (key `fault_injection=` of `epmoe layer`, `train` and the public
// WholeWorldLayer; for the epmoe commands also the environment variable
// EPMOE_FAULT_INJECTION, which mpirun passes on with -x):
//
//     RANK:POINT[:ACTION[:NTH]]
//
//   RANK    the rank that fails (0-based)
//   POINT   where: `collective` (inside a collective's algorithm, with its
//           messages in flight), `dispatch` (inside an EP dispatcher between
//           posting the token exchange and waiting for it), `checkpoint`
//           (between writing a checkpoint's files and committing it),
//           `checkpoint_committed` (every rank, once the commit is known to
//           all), or any other name passed to fault_point()
//   ACTION  throw (default: an InjectedFault, a recoverable epmoe::Error),
//           kill (SIGKILL to the own process), stop (the rank stops
//           responding: FaultScope::StopRank says how, below)
//   NTH     fail at the NTH time the rank reaches the point (default 1)
//
// Scope: the spec and its hit counters live in a FaultInjector owned by the
// run that was given the spec (a command, a WholeWorldLayer). Only threads
// working for that run see it: each rank thread installs a FaultScope, and a
// collective's progress thread runs under its launcher's scope. Any other
// layer or run of the same process - another WholeWorldLayer, a per-rank
// MoeLayer, a test's own collectives - never reaches it: before, one
// process-wide spec made an unrelated Python layer fail 8-17 of 150 calls.
//
// Cost at a point with no scope installed: one thread_local read.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace epmoe {

class InjectedFault : public Error {
 public:
  using Error::Error;
};

// One run's spec and how often each rank reached each point. Thread-safe.
class FaultInjector {
 public:
  enum class Action { throw_error, kill, stop };

  // ConfigError naming the key and the rule when `spec` is malformed.
  explicit FaultInjector(std::string_view spec);
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  const std::string& spec() const { return spec_; }
  int rank() const { return rank_; }
  const std::string& point() const { return point_; }
  Action action() const { return action_; }

  // Counts one arrival of `rank` at `point`; true when it is the one the
  // spec fails (its rank, its point, the NTH time).
  bool fires(std::string_view point, int rank);

  // "rank 1: injected fault at dispatch (fault_injection=1:dispatch:stop)"
  std::string describe() const;

  // The stop fired (ACTION stop): that rank no longer answers. The run's
  // error then says so (rethrow_naming_stopped_rank), whichever rank's
  // timeout ended the run.
  void mark_stopped() {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
  }
  bool stopped() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stopped_;
  }
  // Rethrows `error`; when the stop fired (since the last call) and it is an
  // epmoe::Error, as a PeerError whose text ends "; rank R had stopped at
  // POINT (fault_injection=...)", so the run's one error names the rank the
  // others were stuck behind. A later run's error gets no such note.
  [[noreturn]] void rethrow_naming_stopped_rank(std::exception_ptr error);

 private:
  std::string spec_;
  int rank_ = -1;
  std::string point_;
  Action action_ = Action::throw_error;
  long nth_ = 1;
  mutable std::mutex mutex_;                          // guards hits_, stopped_
  std::map<std::pair<int, std::string>, long> hits_;  // (rank, point) -> arrivals
  bool stopped_ = false;
};

// EPMOE_FAULT_INJECTION, or "" when unset: the epmoe commands read it when
// their key is unset (a process per rank under mpirun gets it with -x).
std::string fault_injection_from_environment();

// The run the calling thread works for, while in scope (restores the previous
// scope when it ends). `injector` may be null (no fault).
class FaultScope {
 public:
  // How a rank stops (ACTION stop), given `what` (FaultInjector::describe()):
  // ranks as threads block the calling rank until its peers give up on it
  // (run/rank_fault_scope.h); without one, the own process is SIGSTOPped (a
  // process per rank: mpirun).
  using StopRank = std::function<void(const std::string& what)>;

  explicit FaultScope(FaultInjector* injector, StopRank stop_rank = {});
  ~FaultScope();
  FaultScope(const FaultScope&) = delete;
  FaultScope& operator=(const FaultScope&) = delete;

  FaultInjector* injector() const { return injector_; }
  const StopRank& stop_rank() const { return stop_rank_; }

 private:
  FaultInjector* injector_;
  StopRank stop_rank_;
  const FaultScope* previous_;
};

// The calling thread's scope (nullptr: none), and a way to lend it to
// another thread (a collective's progress thread) for a while: returns the
// previous one, to be restored.
const FaultScope* this_thread_fault_scope();
const FaultScope* set_this_thread_fault_scope(const FaultScope* scope);

// Called at each named point of the work of `rank`; fails as the calling
// thread's scope's injector says when (rank, point) matches for the NTH
// time, else returns at once.
void fault_point(std::string_view point, int rank);

}  // namespace epmoe
