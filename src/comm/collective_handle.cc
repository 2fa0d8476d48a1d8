#include "comm/collective_handle.h"

#include <utility>

#include "comm/progress_threads.h"
#include "core/error.h"
#include "core/fault_injection.h"

namespace epmoe::comm {
namespace {

// How long wait() allows past the deadline for the algorithm to notice it.
constexpr std::chrono::seconds kDeadlineGrace{5};

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
      state_->comm->cancel_pending("rank " + std::to_string(state_->comm->rank()) + " is failing: " +
                                   state_->name + " was abandoned in flight by an exception");
    } catch (...) {  // destructors never throw; the wait below stays bounded by the deadline
    }
    lock.lock();
  }
  // Bounded: the body's own waits end by state_->deadline, or at once when cancelled.
  state_->finished.wait(lock, [&] { return state_->done; });
}

void CollectiveHandle::wait() {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mutex);
  if (!state_->finished.wait_until(lock, state_->deadline + kDeadlineGrace,
                                   [&] { return state_->done; })) {
    throw PeerError(state_->name + ": did not end within its timeout plus " +
                    std::to_string(kDeadlineGrace.count()) + " s");
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
  rethrow_once();
  return true;
}

namespace detail {

void collective_fault_point(const transport::Communicator& comm) { fault_point("collective", comm.rank()); }

}  // namespace detail

CollectiveHandle launch_collective(transport::Communicator& comm, std::string name,
                                   std::chrono::milliseconds timeout,
                                   std::function<void(transport::Deadline)> body) {
  auto state = std::make_shared<detail::CollectiveState>();
  state->deadline = transport::Clock::now() + timeout;
  state->name = std::move(name);
  state->comm = &comm;
  detail::ProgressThreads::instance().submit([state, body = std::move(body)] {
    std::exception_ptr error;
    std::string root_cause;  // non-empty: this collective is where the failure started
    try {
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
    // Before the error is published: peers hear of it now, not at their
    // deadlines. On mpi this ends the job here (MPI_Abort), printing the text.
    if (!root_cause.empty()) {
      state->comm->abort("rank " + std::to_string(state->comm->rank()) + " failed: " + root_cause, error);
    }
    std::lock_guard<std::mutex> lock(state->mutex);
    state->error = std::move(error);  // the progress thread keeps no reference
    state->done = true;
    state->finished.notify_all();
  });
  return CollectiveHandle(std::move(state));
}

}  // namespace epmoe::comm
