#include "comm/collective_handle.h"

#include <utility>

#include "comm/progress_threads.h"
#include "core/error.h"

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
  // Bounded: the body's own waits end by state_->deadline.
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

CollectiveHandle launch_collective(std::string name, std::chrono::milliseconds timeout,
                                   std::function<void(transport::Deadline)> body) {
  auto state = std::make_shared<detail::CollectiveState>();
  state->deadline = transport::Clock::now() + timeout;
  state->name = std::move(name);
  detail::ProgressThreads::instance().submit([state, body = std::move(body)] {
    std::exception_ptr error;
    try {
      body(state->deadline);
    } catch (const PeerError& e) {
      error = std::make_exception_ptr(PeerError(state->name + ": " + e.what()));
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(state->mutex);
    state->error = std::move(error);  // the progress thread keeps no reference
    state->done = true;
    state->finished.notify_all();
  });
  return CollectiveHandle(std::move(state));
}

}  // namespace epmoe::comm
