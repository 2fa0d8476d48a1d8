#include "transport/threads/virtual_timeline.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace epmoe::transport::threads {

namespace detail {

struct VirtualMessage {
  int src = 0, dst = 0;
  std::int64_t num_bytes = 0;
  std::vector<LinkHop> path;
  Picoseconds posted = 0;
  Picoseconds sender_join = 0;  // idle up to here counts as waiting for the sender
  bool send_known = false, arrival_known = false;
  Picoseconds send_done = 0, arrival = 0;
  VirtualRequest* send = nullptr;  // the requests still waiting to learn the times
  VirtualRequest* receive = nullptr;
  TraceTrack trace;
};

}  // namespace detail

using detail::VirtualMessage;
using detail::VirtualRequest;

namespace {

// splitmix64: stream ids from (parent id, child number), fixed by program order.
std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  std::uint64_t z = a * 0x9E3779B97F4A7C15ULL + b + 0x632BE59BD9B4E019ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

Picoseconds completion(const VirtualRequest& request, bool* known) {
  const VirtualMessage* m = request.message.get();
  if (m == nullptr) {
    *known = false;
    return 0;
  }
  *known = request.is_send ? m->send_known : m->arrival_known;
  return request.is_send ? m->send_done : m->arrival;
}

}  // namespace

class VirtualStream final : public ModelledClock {
 public:
  VirtualStream(VirtualTimeline& timeline, int rank, std::uint64_t id, Picoseconds start, std::string name)
      : timeline_(timeline), rank_(rank), id_(id), name_(std::move(name)), clock_(start), start_(start) {}

  // ModelledClock (called by the owning thread).
  Picoseconds now() const override {
    std::lock_guard<std::mutex> lock(timeline_.mutex_);
    return clock_;
  }
  bool measures_compute() const override { return timeline_.options_.measured_compute; }
  void charge_compute(const ComputeWork& work, double cpu_seconds, const char* name) noexcept override {
    std::lock_guard<std::mutex> lock(timeline_.mutex_);
    auto fail = [&](const std::string& what) noexcept {
      timeline_.overflowed_locked({});  // first: the message below needs memory
      try {
        timeline_.overflowed_locked("rank " + std::to_string(rank_) + ": " + what);
      } catch (...) {
      }
    };
    try {
      const Picoseconds duration = timeline_.compute_duration(work, cpu_seconds, name);
      try {
        timeline_.charge_locked(*this, duration);
      } catch (const ConfigError& e) {
        fail(std::string(e.what()) + " (adding compute '" + name + "')");
      }
    } catch (const ConfigError& e) {
      fail(e.what());
    } catch (...) {
      fail(std::string("clock=modelled: charging compute '") + name + "' failed");
    }
  }
  ModelledTotals totals() const override {
    std::lock_guard<std::mutex> lock(timeline_.mutex_);
    timeline_.throw_if_overflowed_locked();
    return totals_;
  }
  std::vector<ModelledCollective> collectives(std::size_t first) const override {
    std::lock_guard<std::mutex> lock(timeline_.mutex_);
    if (first >= collectives_.size()) return {};
    return {collectives_.begin() + static_cast<std::ptrdiff_t>(first), collectives_.end()};
  }
  std::size_t num_collectives() const override {
    std::lock_guard<std::mutex> lock(timeline_.mutex_);
    return collectives_.size();
  }

 private:
  friend class VirtualTimeline;
  enum class State { running, blocked, finished };

  // A rank's stream as new (VirtualTimeline::restart; its mutex held).
  void restart() {
    clock_ = start_ = 0;
    state_ = State::running;
    awaiting_request_ = nullptr;
    awaiting_stream_ = nullptr;
    next_message_ = next_child_ = 0;
    totals_ = {};
    collectives_.clear();
    bytes_sent_ = 0;
    latest_peer_join_ = 0;
    waited_for_senders_until_ = 0;
  }

  VirtualTimeline& timeline_;
  int rank_;
  std::uint64_t id_;
  std::uint64_t launch_number_ = 0;  // 0 for a rank; k for its parent's k-th launch
  std::string name_;                 // collectives: "all_to_all_v tag 3"; ranks: ""
  // Everything below is guarded by timeline_.mutex_.
  Picoseconds clock_;
  Picoseconds start_;
  State state_ = State::running;
  const VirtualRequest* awaiting_request_ = nullptr;
  const VirtualStream* awaiting_stream_ = nullptr;
  std::uint64_t next_message_ = 0;
  std::uint64_t next_child_ = 0;
  ModelledTotals totals_;
  std::vector<ModelledCollective> collectives_;  // launched by this stream and waited for
  // As a collective: what it sent, and the latest join of a peer it heard from.
  std::int64_t bytes_sent_ = 0;
  Picoseconds latest_peer_join_ = 0;
  // The latest time up to which a wait of this stream was idle (its sender
  // had not joined yet). A collective that forwards a message after such a
  // wait passes the delay on: the message's sender_join is at least this, so
  // the next rank of a chain books the slow rank's lateness as idle too.
  Picoseconds waited_for_senders_until_ = 0;
};

struct VirtualTimeline::HopEvent {
  Picoseconds time;
  // Ties at one time: the earlier-launched collective first (its number
  // among its rank's launches), then rank, stream and message order.
  std::uint64_t launch_number;
  int rank;
  std::uint64_t stream_id;
  std::uint64_t message_number;
  int hop;
  // A switched hop is taken in two events: its egress port when the message
  // enters, its ingress port when the egress starts sending (so ingress
  // ports serve messages in the order their bytes start to flow).
  int port = 0;
  Picoseconds egress_done = 0;
  std::shared_ptr<VirtualMessage> message;
};

bool VirtualTimeline::LaterEvent::operator()(const HopEvent& a, const HopEvent& b) const {
  if (a.time != b.time) return a.time > b.time;
  if (a.launch_number != b.launch_number) return a.launch_number > b.launch_number;
  if (a.rank != b.rank) return a.rank > b.rank;
  if (a.stream_id != b.stream_id) return a.stream_id > b.stream_id;
  if (a.message_number != b.message_number) return a.message_number > b.message_number;
  if (a.hop != b.hop) return a.hop > b.hop;
  return a.port > b.port;
}

VirtualTimeline::VirtualTimeline(int num_ranks, const EmulatedLinkOptions& links, const ModelledTimeOptions& options)
    : num_ranks_(num_ranks), options_(options), paths_(num_ranks, links), schedule_(paths_.num_resources()) {
  links.validate();
  options_.validate();
  for (int rank = 0; rank < num_ranks; ++rank) {
    rank_streams_.push_back(
        std::make_unique<VirtualStream>(*this, rank, mix(0, static_cast<std::uint64_t>(rank)), 0, std::string()));
    live_.push_back(rank_streams_.back().get());
  }
}

VirtualTimeline::~VirtualTimeline() = default;

ModelledClock& VirtualTimeline::rank_clock(int rank) { return *rank_streams_.at(static_cast<std::size_t>(rank)); }

void VirtualTimeline::finish_rank(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  VirtualStream& stream = *rank_streams_.at(static_cast<std::size_t>(rank));
  if (stream.state_ == VirtualStream::State::finished) return;
  stream.state_ = VirtualStream::State::finished;
  live_.erase(std::remove(live_.begin(), live_.end(), &stream), live_.end());
  resolve_locked();
}

void VirtualTimeline::restart() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const VirtualStream* stream : live_) {
    if (!stream->name_.empty()) {
      throw UsageError("clock=modelled: rank " + std::to_string(stream->rank_) + "'s collective '" + stream->name_ +
                       "' is still in flight from the previous run; a run must wait for its collectives before "
                       "modelled time can start afresh for the next one");
    }
  }
  // Every stream has finished or is a rank's (above), so no hop can still be
  // pending: the last finish_rank resolved them all (GVT = never).
  EPMOE_CHECK(events_.empty() || overflowed_, "hops left at restart: ", events_.size());
  events_ = {};
  overflowed_ = false;
  overflow_.clear();
  live_.clear();
  for (auto& stream : rank_streams_) {
    stream->restart();
    live_.push_back(stream.get());
  }
  schedule_ = LinkSchedule(paths_.num_resources());
}

VirtualStream& VirtualTimeline::calling_stream(const char* what) const {
  auto* stream = dynamic_cast<VirtualStream*>(this_thread_modelled_clock());
  if (stream == nullptr || &stream->timeline_ != this) {
    throw ConfigError(std::string("clock=modelled: ") + what +
                      " from a thread that runs on no modelled clock of this group (only rank threads and "
                      "their collectives may communicate)");
  }
  return *stream;
}

Picoseconds VirtualTimeline::compute_duration(const ComputeWork& work, double cpu_seconds, const char* name) const {
  const double flop_rate = options_.peak_flops * options_.compute_efficiency;
  const double seconds = options_.measured_compute
                             ? std::max(0.0, cpu_seconds) * options_.compute_scale
                             : std::max(work.flops / flop_rate, work.bytes / options_.memory_bytes_per_s);
  if (seconds <= kMaxModelledSeconds) return seconds_to_picoseconds(seconds);
  // Past the clock's range: the text of the error (only then: it costs more than the step).
  std::ostringstream what;
  what << "compute '" << name << "' (";
  if (options_.measured_compute) {
    what << cpu_seconds << " s of CPU x compute_scale " << options_.compute_scale << ")";
  } else {
    what << work.flops << " FLOP at " << flop_rate << " FLOP/s = the hardware's peak_bf16_tflops x compute_efficiency, "
         << work.bytes << " bytes at " << options_.memory_bytes_per_s << " B/s = its memory_gb_per_s)";
  }
  return seconds_to_picoseconds(seconds, what.str());
}

void VirtualTimeline::charge_locked(VirtualStream& stream, Picoseconds duration) {
  stream.clock_ = add_picoseconds(stream.clock_, duration, "a rank's modelled clock");
  stream.totals_.compute += duration;  // at most the clock's advance
  resolve_locked();
}

void VirtualTimeline::overflowed_locked(std::string message) noexcept {
  if (overflow_.empty()) overflow_ = std::move(message);
  overflowed_ = true;
  ++wake_generation_;  // every waiter re-checks, and throws it
  changed_.notify_all();
}

void VirtualTimeline::throw_if_overflowed_locked() const {
  if (!overflowed_) return;
  throw ConfigError(overflow_.empty() ? "clock=modelled: a modelled time is beyond the clock's range" : overflow_);
}

void VirtualTimeline::throw_if_overflowed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  throw_if_overflowed_locked();
}

Picoseconds VirtualTimeline::floor_locked(const VirtualStream& stream) const {
  switch (stream.state_) {
    case VirtualStream::State::running:
      return stream.clock_;
    case VirtualStream::State::finished:
      return kNeverPicoseconds;
    case VirtualStream::State::blocked:
      break;
  }
  if (stream.awaiting_request_ != nullptr) {
    bool known = false;
    const Picoseconds done = completion(*stream.awaiting_request_, &known);
    return known ? std::max(stream.clock_, done) : kNeverPicoseconds;
  }
  if (stream.awaiting_stream_ != nullptr) {
    const VirtualStream& other = *stream.awaiting_stream_;
    return other.state_ == VirtualStream::State::finished ? std::max(stream.clock_, other.clock_) : kNeverPicoseconds;
  }
  return stream.clock_;
}

Picoseconds VirtualTimeline::gvt_locked() const {
  Picoseconds gvt = kNeverPicoseconds;
  for (const VirtualStream* stream : live_) gvt = std::min(gvt, floor_locked(*stream));
  return gvt;
}

void VirtualTimeline::resolve_locked() noexcept {
  if (overflowed_) return;  // its times are past the clock: nothing after them is meaningful
  try {
    resolve_events_locked();
  } catch (const std::exception& e) {  // ConfigError (a time past the clock's range), or out of memory
    overflowed_locked({});
    try {
      overflowed_locked(e.what());
    } catch (...) {
    }
  }
}

void VirtualTimeline::resolve_events_locked() {
  Picoseconds gvt = gvt_locked();
  bool resolved_any = false;
  auto lower_gvt_for = [&](VirtualRequest* request) {
    if (request != nullptr && request->waiter != nullptr) gvt = std::min(gvt, floor_locked(*request->waiter));
  };
  while (!events_.empty() && events_.top().time < gvt) {
    HopEvent event = events_.top();
    events_.pop();
    VirtualMessage& m = *event.message;
    const LinkHop& hop = m.path[static_cast<std::size_t>(event.hop)];
    resolved_any = true;
    Picoseconds serialise = 0, pushed_out = 0, reached = 0;
    try {
      serialise = hop.serialise(m.num_bytes);
      if (event.port == 0) {
        pushed_out = schedule_.take_link(hop.resources[0], event.time, serialise, LinkSchedule::kNoBound);
        reached = add_picoseconds(pushed_out, hop.latency, "the arrival time of a message");
      } else {
        reached = add_picoseconds(schedule_.take_link(hop.resources[1], event.time, serialise, event.egress_done),
                                  hop.latency, "the arrival time of a message");
      }
    } catch (const ConfigError& e) {
      throw ConfigError(std::string(e.what()) + " (a message of " + std::to_string(m.num_bytes) + " bytes from rank " +
                        std::to_string(m.src) + " to rank " + std::to_string(m.dst) + ", hop " +
                        std::to_string(event.hop + 1) + " of " + std::to_string(m.path.size()) + ")");
    }
    if (event.port == 0 && hop.num_resources == 2) {  // the ingress port next, from when the egress starts
      events_.push({pushed_out - serialise, event.launch_number, event.rank, event.stream_id, event.message_number,
                    event.hop, 1, pushed_out, event.message});
    }
    if (event.hop == 0 && event.port == 0) {
      m.send_done = pushed_out;
      m.send_known = true;
      lower_gvt_for(m.send);
    }
    if (event.port == 0 && hop.num_resources == 2) continue;  // arrives after its ingress event
    if (static_cast<std::size_t>(event.hop) + 1 < m.path.size()) {
      events_.push({reached, event.launch_number, event.rank, event.stream_id, event.message_number, event.hop + 1, 0,
                    0, event.message});
      continue;
    }
    m.arrival = reached;
    m.arrival_known = true;
    lower_gvt_for(m.receive);
    if (m.trace.recorder != nullptr) {
      m.trace.recorder->add_message(m.src, "to rank " + std::to_string(m.dst), to_seconds(m.posted) * 1e6,
                                    to_seconds(m.arrival) * 1e6,
                                    {{"bytes", static_cast<double>(m.num_bytes)},
                                     {"peer", static_cast<double>(m.dst)},
                                     {"hops", static_cast<double>(m.path.size())}});
    }
  }
  if (resolved_any) changed_.notify_all();
}

std::shared_ptr<ModelledClock> VirtualTimeline::fork(const std::string& name) {
  VirtualStream& parent = calling_stream("launching a collective");
  std::lock_guard<std::mutex> lock(mutex_);
  throw_if_overflowed_locked();
  auto child =
      std::make_shared<VirtualStream>(*this, parent.rank_, mix(parent.id_, ++parent.next_child_), parent.clock_, name);
  child->launch_number_ = parent.next_child_;
  live_.push_back(child.get());
  return child;
}

void VirtualTimeline::finish(ModelledClock& collective) {
  auto& stream = static_cast<VirtualStream&>(collective);
  std::lock_guard<std::mutex> lock(mutex_);
  stream.state_ = VirtualStream::State::finished;
  live_.erase(std::remove(live_.begin(), live_.end(), &stream), live_.end());
  resolve_locked();
  changed_.notify_all();
}

void VirtualTimeline::begin_wait(ModelledClock& collective) {
  VirtualStream& waiter = calling_stream("waiting for a collective");
  std::lock_guard<std::mutex> lock(mutex_);
  throw_if_overflowed_locked();
  waiter.state_ = VirtualStream::State::blocked;
  waiter.awaiting_stream_ = &static_cast<VirtualStream&>(collective);
  resolve_locked();
}

void VirtualTimeline::end_wait(ModelledClock& collective) {
  VirtualStream& waiter = calling_stream("waiting for a collective");
  const auto& child = static_cast<const VirtualStream&>(collective);
  std::lock_guard<std::mutex> lock(mutex_);
  const Picoseconds w = waiter.clock_;
  const Picoseconds end = child.clock_;
  if (end > w) {
    const Picoseconds idle = std::clamp(child.latest_peer_join_ - w, Picoseconds{0}, end - w);
    waiter.totals_.idle += idle;
    waiter.totals_.communication += end - w - idle;
    waiter.clock_ = end;
  }
  waiter.collectives_.push_back({child.name_, child.start_, end, std::min(w, end), child.bytes_sent_});
  // A collective waiting for a part it forked (comm/forked_part.h: a ring
  // lane) owns the part's bytes.
  if (!waiter.name_.empty()) waiter.bytes_sent_ += child.bytes_sent_;
  waiter.state_ = VirtualStream::State::running;
  waiter.awaiting_stream_ = nullptr;
}

void VirtualTimeline::post_send(int src, int dst, std::int64_t num_bytes, VirtualRequest& request) {
  VirtualStream& sender = calling_stream("sending a message");
  EPMOE_CHECK(sender.rank_ == src);
  auto message = std::make_shared<VirtualMessage>();
  message->src = src;
  message->dst = dst;
  message->num_bytes = num_bytes;
  message->path = paths_.path(src, dst);
  for (LinkHop& hop : message->path) hop.latency = std::max<Picoseconds>(hop.latency, 1);
  message->trace = this_thread_trace_track();
  std::lock_guard<std::mutex> lock(mutex_);
  throw_if_overflowed_locked();
  message->posted = sender.clock_;
  // A rank posts when it is ready: idle for its receiver up to the post. A
  // collective joined at its launch, or later when it was itself held up by
  // a late sender before forwarding this (a ring's later steps): a delay
  // caused by a rank's compute stays idle along the whole chain (issue 30).
  message->sender_join =
      sender.name_.empty() ? sender.clock_ : std::max(sender.start_, sender.waited_for_senders_until_);
  message->send = &request;
  sender.bytes_sent_ += num_bytes;
  request.message = message;
  request.is_send = true;
  const std::uint64_t number = sender.next_message_++;
  if (message->path.empty()) {  // to itself: a copy, done when posted
    message->send_done = message->arrival = message->posted;
    message->send_known = message->arrival_known = true;
    return;
  }
  events_.push({message->posted, sender.launch_number_, src, sender.id_, number, 0, 0, 0, message});
  resolve_locked();
}

void VirtualTimeline::matched(VirtualRequest& receive, const VirtualRequest& send) {
  std::lock_guard<std::mutex> lock(mutex_);
  receive.message = send.message;
  receive.is_send = false;
  if (receive.message) receive.message->receive = &receive;
  resolve_locked();  // a receiver blocked on it may now have a known completion
  changed_.notify_all();
}

void VirtualTimeline::stage(const VirtualRequest& send, VirtualRequest& staged) {
  std::lock_guard<std::mutex> lock(mutex_);
  staged.message = send.message;
  staged.is_send = true;
}

void VirtualTimeline::release(VirtualRequest& request) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (request.message) {
    if (request.message->send == &request) request.message->send = nullptr;
    if (request.message->receive == &request) request.message->receive = nullptr;
  }
  request.message.reset();
  if (request.waiter != nullptr) {  // a wait left by an exception
    if (request.waiter->state_ == VirtualStream::State::blocked) request.waiter->state_ = VirtualStream::State::running;
    request.waiter->awaiting_request_ = nullptr;
    request.waiter = nullptr;
  }
}

void VirtualTimeline::begin_request_wait(VirtualRequest& request) {
  VirtualStream& waiter = calling_stream("waiting for a message");
  std::lock_guard<std::mutex> lock(mutex_);
  throw_if_overflowed_locked();
  waiter.state_ = VirtualStream::State::blocked;
  waiter.awaiting_request_ = &request;
  request.waiter = &waiter;
  resolve_locked();
}

void VirtualTimeline::wait_for_completion(VirtualRequest& request, Deadline deadline,
                                          const std::function<void(bool timed_out)>& check) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    throw_if_overflowed_locked();  // its completion may never be known
    bool known = false;
    completion(request, &known);
    if (known) return;
    const bool timed_out = Clock::now() >= deadline;
    // check() takes the mailbox lock, which must not be taken under ours;
    // an abort between it and the sleep below shows as a new wake-up
    // generation, so it is never slept through.
    const std::uint64_t generation = wake_generation_;
    lock.unlock();
    check(timed_out);  // throws on abort, cancel or timeout
    lock.lock();
    completion(request, &known);
    if (known) return;
    if (wake_generation_ != generation) continue;
    changed_.wait_until(lock, deadline);
  }
}

void VirtualTimeline::end_request_wait(VirtualRequest& request) {
  std::lock_guard<std::mutex> lock(mutex_);
  VirtualStream* waiter = request.waiter;
  if (waiter == nullptr) return;
  bool known = false;
  const Picoseconds done = completion(request, &known);
  EPMOE_CHECK(known);
  const Picoseconds w = waiter->clock_;
  if (done > w) {
    Picoseconds idle = 0;
    if (!request.is_send) {
      const VirtualMessage& m = *request.message;
      idle = std::clamp(m.sender_join - w, Picoseconds{0}, done - w);
      waiter->latest_peer_join_ = std::max(waiter->latest_peer_join_, m.sender_join);
      if (idle > 0) waiter->waited_for_senders_until_ = std::max(waiter->waited_for_senders_until_, w + idle);
    }
    waiter->totals_.idle += idle;
    waiter->totals_.communication += done - w - idle;
    waiter->clock_ = done;
  } else if (!request.is_send) {
    waiter->latest_peer_join_ = std::max(waiter->latest_peer_join_, request.message->sender_join);
  }
  waiter->state_ = VirtualStream::State::running;
  waiter->awaiting_request_ = nullptr;
  request.waiter = nullptr;
}

bool VirtualTimeline::completed_by_now(const VirtualRequest& request) {
  VirtualStream& stream = calling_stream("testing a message");
  std::lock_guard<std::mutex> lock(mutex_);
  throw_if_overflowed_locked();
  bool known = false;
  const Picoseconds done = completion(request, &known);
  return known && done <= stream.clock_;
}

void VirtualTimeline::wake_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++wake_generation_;
  changed_.notify_all();
}

}  // namespace epmoe::transport::threads
