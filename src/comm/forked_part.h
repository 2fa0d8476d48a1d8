// ForkedPart: one part of a collective run on a second progress thread, on
// a modelled clock of its own (internal to comm/). In modelled time a
// collective's stream has one clock, so two independent streams of messages
// inside it - the two lanes of the bidirectional ring all-gather - would
// each wait for the other: a rank forwards lane 0's step s only once its
// clock passed every earlier wait, lane 1's included, and on links where one
// lane's hops are slower (the NICs of two_level) the faster lane inherits
// every delay of the slower one (issue 30: 55.3 us bidirectional against
// 38.3 us unidirectional at R=16 on h200). Forking a clock per part keeps
// them apart, as two DMA engines would be.
//
// The part starts at the caller's clock; join() waits for it and takes the
// caller's clock to max(its clock, the part's end). The part's bytes are
// counted as the caller's (transport::this_thread_bytes_sent), so the
// collective's trace and report keep every byte it sent. The part traces to
// the caller's track and runs in the caller's fault scope.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "core/modelled_clock.h"
#include "transport/communicator.h"

namespace epmoe::comm::detail {

class ForkedPart {
 public:
  // Only on a thread that runs on a modelled clock of comm's group
  // (comm.collective_clocks() != nullptr).
  ForkedPart(transport::Communicator& comm, const std::string& name, std::function<void()> part);
  // Waits for the part; rethrows its error.
  void join();
  // Joins quietly when join() was not called (the caller failed): the part's
  // own waits are bounded by their deadlines.
  ~ForkedPart();
  // The part's clock. A caller whose requests the part waited on keeps it
  // until those requests are gone: a wait left by an exception points at
  // the clock until its request is released.
  std::shared_ptr<ModelledClock> clock() const { return clock_; }
  ForkedPart(const ForkedPart&) = delete;
  ForkedPart& operator=(const ForkedPart&) = delete;

 private:
  struct State {
    std::mutex mutex;  // guards done, error, bytes_sent
    std::condition_variable finished;
    bool done = false;
    std::exception_ptr error;
    std::int64_t bytes_sent = 0;
  };
  void wait_for_part() noexcept;

  transport::Communicator& comm_;
  std::shared_ptr<ModelledClock> clock_;
  std::shared_ptr<State> state_;
  bool joined_ = false;
};

}  // namespace epmoe::comm::detail
