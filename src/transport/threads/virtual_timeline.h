// Modelled time for the threads transport (clock=modelled, DESIGN.md §4.11).
//
// Streams. Every rank thread runs on a stream, and so does every collective
// in flight (forked from its caller at launch, comm/collective_handle.cc).
// A stream's clock advances by charged compute (ComputeScope) and by waits:
// a wait takes max(clock, the completion's virtual time).
//
// Messages. A send leaves at its stream's virtual time and crosses the hops
// of its path (threads/emulated_links.h: bandwidth, latency, topology,
// store-and-forward, contention on a link direction) independently of what
// the sender computes next. A receive completes at the message's arrival; a
// send when its last byte left the first hop. The bytes themselves move at
// once in real time, through the mailboxes, as in wall mode.
//
// Determinism. Links serve messages first come, first served in VIRTUAL
// time: the hops of all messages are taken in one global order of (entry
// time, stream id, the stream's message number), ids and numbers fixed by
// each rank's program order. A hop entering at time t is taken only once no
// stream can still post a message entering before t, i.e. t < GVT, the
// minimum over streams of the earliest time each can next post:
//   running: its clock; finished: never;
//   blocked on a message or collective whose completion is known: max(clock,
//   completion); whose completion is not known yet: never by itself - it
//   waits on an event below GVT or on a stream that GVT counts.
// A message needs latency > 0 to make progress past ties (a zero latency is
// taken as 1 ps). So the schedule, and every modelled time, is a function of
// the config and the seed alone - the host's scheduling only decides how
// long in real time the threads wait for each other (a rank behind in
// virtual time holds back the hops of everyone ahead of it).
//
// Bookkeeping: per stream the totals of ModelledTotals. A wait of w..c on a
// receive counts as idle up to the sender's join time (its post time; for a
// collective's message, when the sender launched the collective), and as
// communication after; a wait on a collective likewise up to the latest join
// of the peers it heard from directly.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <vector>

#include "core/modelled_clock.h"
#include "core/trace_recorder.h"
#include "hardware/modelled_time_options.h"
#include "transport/collective_clocks.h"
#include "transport/communicator.h"
#include "transport/threads/emulated_links.h"

namespace epmoe::transport::threads {

// The device's rates live below transport/ (hardware/modelled_time_options.h),
// where a hardware preset is turned into them.
using hardware::ModelledTimeOptions;

class VirtualTimeline;
class VirtualStream;

namespace detail {
struct VirtualMessage;
// The modelled side of one transport request (guarded by the timeline's mutex).
struct VirtualRequest {
  std::shared_ptr<VirtualMessage> message;  // a send's at post, a receive's once matched
  bool is_send = false;
  VirtualStream* waiter = nullptr;  // the stream blocked on it
};
}  // namespace detail

class VirtualTimeline final : public CollectiveClocks {
 public:
  VirtualTimeline(int num_ranks, const EmulatedLinkOptions& links, const ModelledTimeOptions& options);
  ~VirtualTimeline() override;

  ModelledClock& rank_clock(int rank);
  // The rank's thread returned (or threw): it posts nothing more.
  void finish_rank(int rank);
  // Starts modelled time afresh between two runs on the same ranks (a
  // persistent launcher, threads/rank_threads.h): every rank's clock back to
  // 0 and running, its totals, collectives, message and launch numbers
  // cleared, every link free - so the next run's times are those of a run on
  // a new timeline. The rank clocks stay the same objects. Throws UsageError
  // naming the collective when one launched in the previous run is still in
  // flight (its clock would straddle the two runs).
  void restart();

  // CollectiveClocks (called from comm/).
  std::shared_ptr<ModelledClock> fork(const std::string& name) override;
  void finish(ModelledClock& collective) override;
  void begin_wait(ModelledClock& collective) override;
  void end_wait(ModelledClock& collective) override;

  // Transport side (threads/communicator.cc). The calling thread must run on
  // a stream of rank `src` (ConfigError otherwise).
  void post_send(int src, int dst, std::int64_t num_bytes, detail::VirtualRequest& request);
  // The mailbox matched a receive with its send.
  void matched(detail::VirtualRequest& receive, const detail::VirtualRequest& send);
  // A queued send's bytes moved into the mailbox (threads/mailbox.h): its
  // receive will be matched with `staged`, which carries the same message.
  void stage(const detail::VirtualRequest& send, detail::VirtualRequest& staged);
  // A request is going away: forget it.
  void release(detail::VirtualRequest& request);
  // A wait on a request, in three calls (threads/communicator.cc's
  // ThreadsRequest::wait_until, between which it waits for the bytes in its
  // mailbox): begin marks the calling stream blocked on `request`;
  // wait_for_completion sleeps until the request's virtual completion is
  // known, calling `check` whenever woken (it throws on abort, cancel and,
  // with timed_out, the deadline); end moves the clock to max(clock,
  // completion) and books the wait as idle or communication.
  void begin_request_wait(detail::VirtualRequest& request);
  void wait_for_completion(detail::VirtualRequest& request, Deadline deadline,
                           const std::function<void(bool timed_out)>& check);
  void end_request_wait(detail::VirtualRequest& request);
  // True when the request completed at or before the calling stream's clock.
  bool completed_by_now(const detail::VirtualRequest& request);

  void wake_all();  // abort / cancel: waiters re-check

  // ConfigError when a modelled time did not fit the clock (a rank's run
  // calls this when its job returns, so an overflow in its last compute is
  // not lost; threads/rank_run.cc).
  void throw_if_overflowed() const;

 private:
  friend class VirtualStream;
  struct HopEvent;
  struct LaterEvent {
    bool operator()(const HopEvent& a, const HopEvent& b) const;
  };

  VirtualStream& calling_stream(const char* what) const;
  Picoseconds floor_locked(const VirtualStream& stream) const;
  Picoseconds gvt_locked() const;
  // Takes every hop below GVT, in order. Never throws: a time past the
  // clock's range poisons the timeline (overflowed_locked).
  void resolve_locked() noexcept;
  void resolve_events_locked();
  void charge_locked(VirtualStream& stream, Picoseconds duration);
  // ConfigError naming the operation `name` when its duration does not fit the clock.
  Picoseconds compute_duration(const ComputeWork& work, double cpu_seconds, const char* name) const;
  // The first time that did not fit the clock (core/modelled_clock.h) ends
  // modelled time for every rank: it is kept, every waiter is woken, and
  // every later call that may throw throws it as a ConfigError (a stream's
  // compute charge and the links' schedule run where throwing cannot:
  // destructors, or another rank's thread).
  void overflowed_locked(std::string message) noexcept;  // the first message is kept
  void throw_if_overflowed_locked() const;

  int num_ranks_;
  ModelledTimeOptions options_;
  LinkPaths paths_;
  mutable std::mutex mutex_;  // guards everything below and every stream's mutable state
  std::condition_variable changed_;
  std::uint64_t wake_generation_ = 0;  // counts wake_all() calls (abort, cancel) and the overflow
  bool overflowed_ = false;            // a modelled time went past the clock's range
  std::string overflow_;               // the first one's message
  LinkSchedule schedule_;
  std::vector<std::unique_ptr<VirtualStream>> rank_streams_;
  std::vector<VirtualStream*> live_;  // streams that may still post
  std::priority_queue<HopEvent, std::vector<HopEvent>, LaterEvent> events_;
};

}  // namespace epmoe::transport::threads
