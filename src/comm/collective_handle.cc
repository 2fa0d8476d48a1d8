#include "comm/collective_handle.h"

#include <utility>

#include "comm/cooperative_progress.h"
#include "comm/progress_threads.h"
#include "core/error.h"
#include "core/fault_injection.h"

namespace epmoe::comm {
namespace {

// How long wait() allows past the deadline for the algorithm to notice it.
constexpr std::chrono::seconds kDeadlineGrace{5};

// Modelled time: the caller's clock waits on the collective's for the scope
// (transport/collective_clocks.h) - a caller blocked on a collective while
// counted as running would hold back every clock behind its own, the
// collective's included - and moves to its end, also when it failed. Quiet
// (a destructor's): never throws, and does nothing on a thread of no clock.
class ModelledWaitScope {
 public:
  ModelledWaitScope(const detail::CollectiveState& state, bool quiet) : quiet_(quiet) {
    if (!state.clock || (quiet && this_thread_modelled_clock() == nullptr)) return;
    clock_ = state.clock.get();
    clocks_ = state.comm->collective_clocks();
    try {
      clocks_->begin_wait(*clock_);
    } catch (...) {
      clocks_ = nullptr;
      if (!quiet_) throw;
    }
  }
  ~ModelledWaitScope() {
    if (clocks_ == nullptr) return;
    try {
      clocks_->end_wait(*clock_);
    } catch (...) {  // only a thread of no clock throws, and begin_wait has ruled that out
    }
  }
  ModelledWaitScope(const ModelledWaitScope&) = delete;
  ModelledWaitScope& operator=(const ModelledWaitScope&) = delete;

 private:
  bool quiet_;
  ModelledClock* clock_ = nullptr;
  transport::CollectiveClocks* clocks_ = nullptr;
};

}  // namespace

CollectiveHandle& CollectiveHandle::operator=(CollectiveHandle&& other) noexcept {
  if (this != &other) {
    finish_quietly();
    state_ = std::move(other.state_);
  }
  return *this;
}

CollectiveHandle::~CollectiveHandle() { finish_quietly(); }

void CollectiveHandle::finish_quietly() noexcept {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mutex);
  if (!state_->done && std::uncaught_exceptions() > 0) {
    // The caller is failing with this collective in flight: its buffers are
    // about to go, and waiting out the deadline (60 s by default) would hold
    // the error back from the launcher that tells the peers.
    lock.unlock();
    try {
      state_->comm->cancel_pending("rank " + std::to_string(state_->comm->rank()) + " is failing: " + state_->name +
                                   " was abandoned in flight by an exception");
    } catch (...) {  // destructors never throw; the wait below stays bounded by the deadline
    }
    lock.lock();
  }
  // Bounded: the body's own waits end by state_->deadline, or at once when cancelled.
  if (state_->done) return;
  lock.unlock();
  const ModelledWaitScope modelled(*state_, /*quiet=*/true);
  std::unique_lock<std::mutex> wait_lock(state_->mutex);  // released before the clock moves on
  state_->finished.wait(wait_lock, [&] { return state_->done; });
}

void CollectiveHandle::wait() {
  if (!state_) return;
  const ModelledWaitScope modelled(*state_, /*quiet=*/false);
  std::unique_lock<std::mutex> lock(state_->mutex);
  if (!state_->finished.wait_until(lock, state_->deadline + kDeadlineGrace, [&] { return state_->done; })) {
    throw PeerError(state_->name + ": did not end within its timeout plus " + std::to_string(kDeadlineGrace.count()) +
                    " s");
  }
  rethrow_once();
}

// The error is moved out before it is rethrown, so that the exception object's
// last reference lives on the caller's thread: the progress thread may drop
// its reference to the state later, and the exception's reference count sits
// in uninstrumented libstdc++ code that ThreadSanitizer cannot see.
void CollectiveHandle::rethrow_once() {
  if (state_->error_reported) {
    throw PeerError(state_->name + ": failed (error reported by an earlier wait/test)");
  }
  if (state_->error) {
    state_->error_reported = true;
    std::rethrow_exception(std::exchange(state_->error, nullptr));
  }
}

bool CollectiveHandle::test() {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!state_->done) return false;
  // Modelled time: ended only once the caller's clock has reached its end
  // (a caller that polls must compute in between, or wait()).
  const ModelledClock* caller = this_thread_modelled_clock();
  if (state_->clock && caller != nullptr && state_->clock->now() > caller->now()) return false;
  rethrow_once();
  return true;
}

namespace detail {

void collective_fault_point(const transport::Communicator& comm) { fault_point("collective", comm.rank()); }

}  // namespace detail

CollectiveHandle launch_collective(transport::Communicator& comm, std::string name, std::chrono::milliseconds timeout,
                                   std::function<void(transport::Deadline)> body) {
  return launch_collective(comm, std::move(name), timeout, nullptr, std::move(body));
}

CollectiveHandle launch_collective(transport::Communicator& comm, std::string name, std::chrono::milliseconds timeout,
                                   std::function<void(transport::Deadline)> prologue,
                                   std::function<void(transport::Deadline)> body) {
  auto state = std::make_shared<detail::CollectiveState>();
  state->deadline = transport::Clock::now() + timeout;
  state->name = std::move(name);
  state->comm = &comm;
  transport::CollectiveClocks* clocks = comm.collective_clocks();
  if (clocks != nullptr) state->clock = clocks->fork(state->name);
  const TraceTrack trace = this_thread_trace_track();
  const double trace_begin_us = this_thread_trace_now_us();
  // Launched off the modelled timeline: its messages are too.
  const bool off_timeline = this_thread_off_timeline();
  // The run the caller works for: its fault_point("collective") is that run's.
  const FaultScope* const faults = this_thread_fault_scope();
  // Wall time: the launching thread may lend its core to this collective
  // (comm/cooperative_progress.h); modelled time has no cores to lend.
  std::shared_ptr<transport::ProgressSlot> slot;
  if (clocks == nullptr) slot = std::make_shared<transport::ProgressSlot>();
  // Wall time: the prologue runs here, so that its messages are posted now
  // rather than when the progress thread gets a core. Its error is the
  // body's: rethrown on the progress thread, it takes the same path.
  std::exception_ptr prologue_error;
  std::int64_t prologue_bytes = 0;
  if (prologue && clocks == nullptr) {
    const std::int64_t before = transport::this_thread_bytes_sent();
    try {
      prologue(state->deadline);
    } catch (...) {
      prologue_error = std::current_exception();
    }
    prologue_bytes = transport::this_thread_bytes_sent() - before;
    prologue = nullptr;
  }
  detail::ProgressThreads::instance().submit([state, clocks, trace, trace_begin_us, off_timeline, faults, slot,
                                              prologue_bytes, prologue_error = std::move(prologue_error),
                                              prologue = std::move(prologue), body = std::move(body)]() mutable {
    std::exception_ptr error;
    std::string root_cause;  // non-empty: this collective is where the failure started
    // The progress thread runs on the collective's clock and traces to its caller's rank.
    const TraceTrack previous_track = set_this_thread_trace_track(trace);
    ModelledClock* const previous_clock = set_this_thread_modelled_clock(state->clock.get());
    const bool previous_off_timeline = set_this_thread_off_timeline(off_timeline);
    transport::ProgressSlot* const previous_slot = transport::set_this_thread_progress_slot(slot.get());
    const FaultScope* const previous_faults = set_this_thread_fault_scope(faults);
    const std::int64_t bytes_before = transport::this_thread_bytes_sent();
    try {
      if (prologue_error) std::rethrow_exception(std::exchange(prologue_error, nullptr));
      if (prologue) prologue(state->deadline);  // modelled time: on the collective's clock
      body(state->deadline);
    } catch (const transport::AbortedError& e) {
      error = std::make_exception_ptr(transport::AbortedError(state->name + ": " + e.what()));
    } catch (const PeerError& e) {
      root_cause = state->name + ": " + e.what();
      error = std::make_exception_ptr(PeerError(root_cause));
    } catch (const std::exception& e) {
      root_cause = state->name + ": " + e.what();
      error = std::current_exception();
    } catch (...) {
      root_cause = state->name + ": unknown exception";
      error = std::current_exception();
    }
    // What the parts hold (their requests, pointing into the caller's
    // buffers) goes before the caller may free those buffers.
    prologue = nullptr;
    body = nullptr;
    // Before the error is published: peers hear of it now, not at their
    // deadlines. On mpi this ends the job here (MPI_Abort), printing the text.
    if (!root_cause.empty()) {
      state->comm->abort("rank " + std::to_string(state->comm->rank()) + " failed: " + root_cause, error);
    }
    // The body is over (and a failure is already told): a lender gets its core back.
    transport::set_this_thread_progress_slot(previous_slot);
    if (slot) slot->finish();
    if (trace.recorder != nullptr) {
      trace.recorder->add_collective(
          trace.pid, state->name, trace_begin_us, this_thread_trace_now_us(),
          {{"bytes_sent", static_cast<double>(prologue_bytes + transport::this_thread_bytes_sent() - bytes_before)}});
    }
    set_this_thread_fault_scope(previous_faults);
    set_this_thread_off_timeline(previous_off_timeline);
    set_this_thread_modelled_clock(previous_clock);
    set_this_thread_trace_track(previous_track);
    if (clocks != nullptr) clocks->finish(*state->clock);
    std::lock_guard<std::mutex> lock(state->mutex);
    state->error = std::move(error);  // the progress thread keeps no reference
    state->done = true;
    state->finished.notify_all();
  });
  if (slot) detail::track_in_flight(std::move(slot));  // once it surely runs
  return CollectiveHandle(std::move(state));
}

}  // namespace epmoe::comm
