// CollectiveHandle: the result of starting an asynchronous collective. Every
// collective in comm/ returns one at once; the algorithm runs on a progress
// thread (comm/progress_threads.h) while the caller computes, and wait()
// collects the outcome.
//
// Timeouts: a collective's options.timeout bounds the whole collective. Every
// transport wait inside it uses the deadline start + timeout, so a missing peer
// surfaces as PeerError ("ring_all_gather tag 7: rank 0: timed out after
// 50 ms waiting to receive from peer 1, tag 113") on the rank that waited for
// it - and on every other rank at once, because a collective whose algorithm
// fails aborts the group from inside (below).
//
// Failure (DESIGN.md §5, "a rank that fails raises on every rank"):
//  * the algorithm throws (a timeout, a size mismatch, an injected fault):
//    launch_collective aborts the group with "rank r failed: <name>: <what>"
//    before the error reaches wait(), so peers wake with that text now, not
//    at their own deadlines (threads: AbortedError on every wait; mpi: the
//    message is printed and the job ends through MPI_Abort). The first reason
//    wins. An AbortedError is a consequence, not a cause: it aborts nothing.
//  * the handle is destroyed unfinished while an exception unwinds (the
//    caller failed with the collective in flight): the rank's pending waits
//    are cancelled (Communicator::cancel_pending), so the destructor returns
//    within milliseconds and the exception reaches the launcher, which
//    aborts the group with the real error text.
//
// Buffers named in the options belong to the collective until wait() returned
// (or threw) or test() returned true.
//
// Modelled time (transport/collective_clocks.h): the collective runs on a
// clock forked from the caller's at launch; wait() takes the caller to
// max(its clock, the collective's end). Tracing: the collective is recorded
// on the caller's trace track (core/trace_recorder.h) from launch to end.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "core/modelled_clock.h"
#include "core/trace_recorder.h"
#include "transport/collective_clocks.h"
#include "transport/communicator.h"

namespace epmoe::comm {

// Long enough for 8 MiB chunks on 8 oversubscribed MPI ranks under ASan,
// short enough that a lost peer is reported within a minute.
constexpr std::chrono::milliseconds kDefaultTimeout{60'000};

namespace detail {
struct CollectiveState {
  std::mutex mutex;  // guards done, error
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;
  bool error_reported = false;  // wait()/test() rethrow the error once
  transport::Deadline deadline;
  std::string name;                         // "ring_all_gather tag 7"
  transport::Communicator* comm = nullptr;  // not owned; outlives every handle on it
  // clock=modelled: the collective's own virtual clock (forked at launch).
  std::shared_ptr<ModelledClock> clock;
};
}  // namespace detail

class CollectiveHandle {
 public:
  CollectiveHandle() = default;  // empty: nothing in flight, wait() returns at once
  CollectiveHandle(CollectiveHandle&&) noexcept = default;
  CollectiveHandle& operator=(CollectiveHandle&& other) noexcept;
  CollectiveHandle(const CollectiveHandle&) = delete;
  CollectiveHandle& operator=(const CollectiveHandle&) = delete;
  // Waits for a collective still in flight and drops its error: never
  // throws. During unwinding it first cancels the rank's pending waits, so
  // the wait is short; otherwise it is bounded by the collective's deadline.
  ~CollectiveHandle();

  // Blocks until the collective ends; rethrows its error (later calls throw a
  // PeerError saying it failed). Throws PeerError if
  // it has not ended a grace period after its deadline (a bug, not a peer).
  void wait();
  // True once ended (modelled time: and the caller's clock is past its end); rethrows its error.
  bool test();

 private:
  friend CollectiveHandle launch_collective(transport::Communicator& comm, std::string name,
                                            std::chrono::milliseconds timeout,
                                            std::function<void(transport::Deadline)> prologue,
                                            std::function<void(transport::Deadline)> body);
  explicit CollectiveHandle(std::shared_ptr<detail::CollectiveState> state) : state_(std::move(state)) {}
  void finish_quietly() noexcept;
  void rethrow_once();  // caller holds state_->mutex

  std::shared_ptr<detail::CollectiveState> state_;  // shared with the progress thread
};

// Runs body(deadline) on a progress thread; PeerErrors it throws are prefixed
// with `name` (AbortedErrors stay AbortedErrors), and any error but an
// AbortedError aborts comm's group (above). Used by every collective in comm/.
CollectiveHandle launch_collective(transport::Communicator& comm, std::string name, std::chrono::milliseconds timeout,
                                   std::function<void(transport::Deadline)> body);
// The same, with a prologue that posts the collective's first messages and
// never waits: in wall time it runs on the calling thread before this
// returns, so those messages flow even while the progress thread waits for a
// core (rank threads filling the cores: comm/cooperative_progress.h); in
// modelled time it runs on the progress thread just before body, on the
// collective's clock. Its errors are the body's (they fail the collective,
// abort the group and reach wait(); launch itself does not throw them).
CollectiveHandle launch_collective(transport::Communicator& comm, std::string name, std::chrono::milliseconds timeout,
                                   std::function<void(transport::Deadline)> prologue,
                                   std::function<void(transport::Deadline)> body);

namespace detail {
// fault_point("collective", rank) (core/fault_injection.h): every algorithm
// calls it once its first messages are posted, so an injected fault fails a
// rank with messages in flight.
void collective_fault_point(const transport::Communicator& comm);
}  // namespace detail

}  // namespace epmoe::comm
