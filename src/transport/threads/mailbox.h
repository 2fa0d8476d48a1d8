// Shared-memory mailboxes of the threads transport (internal to
// transport/threads/). Every message to rank d meets its receive in
// mailbox d: whichever of isend/irecv is posted second finds the other one
// queued, takes both out of the queues under the mailbox lock, and copies the
// bytes straight from the send buffer into the receive buffer with the lock
// released (one copy, no staging buffer). All request state of messages to d
// is guarded by mailbox d's mutex; waiters sleep on its condition variable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "transport/communicator.h"
#include "transport/threads/virtual_timeline.h"

namespace epmoe::transport::threads::detail {

enum class RequestPhase {
  queued,   // waiting in the mailbox for its counterpart
  copying,  // matched; a thread is copying the bytes outside the lock
  done,     // bytes delivered; complete once Clock::now() >= ready_at
  failed,   // size mismatch: `error` says why
};

struct RequestState {
  RequestPhase phase = RequestPhase::queued;
  Clock::time_point ready_at{};  // emulated-link completion time (or epoch)
  std::string error;
  VirtualRequest virtual_request;  // clock=modelled; guarded by the timeline's mutex
  bool on_timeline = false;        // clock=modelled, not in an OffTimelineScope
};

// A send waiting for its receive, or a receive waiting for its send.
struct QueuedSend {
  const void* data;
  std::int64_t num_bytes;
  Clock::time_point send_done;  // emulated link timing, fixed when posted
  Clock::time_point arrival;
  RequestState* state;  // owned by the sender's Request (or by `staged`)
  TraceTrack trace;     // wall clock: where the message's event goes
  double posted_us;
  Clock::time_point posted_at;
  // clock=modelled: a send whose sender stopped waiting for the receive (its
  // virtual completion does not depend on the receiver) keeps a copy of its
  // bytes and a state of its own here; data and state then point into it.
  struct Staged {
    std::vector<std::byte> bytes;
    RequestState state;
  };
  std::shared_ptr<Staged> staged;
};
struct QueuedRecv {
  void* data;
  std::int64_t num_bytes;
  RequestState* state;  // owned by the receiver's Request
};

struct Mailbox {
  using Key = std::pair<int, Tag>;  // (source rank, tag)
  std::mutex mutex;
  std::condition_variable changed;  // any request of this mailbox changed phase, or abort
  // Incremented (under `mutex`) before every notify of `changed`, so that a
  // waiter's progress slot (transport/progress_slot.h) can tell from outside,
  // without this lock, that the waiter has been woken since it went to sleep.
  std::atomic<std::uint64_t> epoch{0};
  void notify_changed() {  // caller holds `mutex`
    epoch.fetch_add(1, std::memory_order_release);
    changed.notify_all();
  }
  std::map<Key, std::deque<QueuedSend>> unmatched_sends;
  std::map<Key, std::deque<QueuedRecv>> unmatched_recvs;
};

}  // namespace epmoe::transport::threads::detail
