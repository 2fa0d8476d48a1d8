#include "comm/forked_part.h"

#include <utility>

#include "comm/progress_threads.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/trace_recorder.h"
#include "transport/collective_clocks.h"

namespace epmoe::comm::detail {

ForkedPart::ForkedPart(transport::Communicator& comm, const std::string& name, std::function<void()> part)
    : comm_(comm), state_(std::make_shared<State>()) {
  transport::CollectiveClocks* clocks = comm.collective_clocks();
  EPMOE_CHECK(clocks != nullptr, "a forked part needs a modelled clock");
  clock_ = clocks->fork(name);
  const TraceTrack trace = this_thread_trace_track();
  const FaultScope* const faults = this_thread_fault_scope();
  ProgressThreads::instance().submit([state = state_, clock = clock_, clocks, trace, faults, part = std::move(part)] {
    const TraceTrack previous_track = set_this_thread_trace_track(trace);
    ModelledClock* const previous_clock = set_this_thread_modelled_clock(clock.get());
    const FaultScope* const previous_faults = set_this_thread_fault_scope(faults);
    const std::int64_t bytes_before = transport::this_thread_bytes_sent();
    std::exception_ptr error;
    try {
      part();
    } catch (...) {
      error = std::current_exception();
    }
    const std::int64_t bytes_sent = transport::this_thread_bytes_sent() - bytes_before;
    set_this_thread_fault_scope(previous_faults);
    set_this_thread_modelled_clock(previous_clock);
    set_this_thread_trace_track(previous_track);
    clocks->finish(*clock);
    std::lock_guard<std::mutex> lock(state->mutex);
    state->error = std::move(error);
    state->bytes_sent = bytes_sent;
    state->done = true;
    state->finished.notify_all();
  });
}

// Blocked on the part's clock while it runs (a caller counted as running
// would hold back every clock behind its own, the part's included), then at
// max(own clock, the part's end).
void ForkedPart::wait_for_part() noexcept {
  transport::CollectiveClocks* clocks = comm_.collective_clocks();
  bool waiting = false;
  try {
    clocks->begin_wait(*clock_);
    waiting = true;
  } catch (...) {  // the clock overflowed: the real-time wait below still holds
  }
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->finished.wait(lock, [&] { return state_->done; });
    transport::count_bytes_sent(state_->bytes_sent);
  }
  if (waiting) {
    try {
      clocks->end_wait(*clock_);
    } catch (...) {  // only a thread of no clock throws, and begin_wait has ruled that out
    }
  }
}

void ForkedPart::join() {
  joined_ = true;
  wait_for_part();
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->error) std::rethrow_exception(std::exchange(state_->error, nullptr));
}

ForkedPart::~ForkedPart() {
  if (!joined_) wait_for_part();
}

}  // namespace epmoe::comm::detail
