#include "transport/threads/communicator.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "core/trace_recorder.h"
#include "transport/progress_slot.h"

namespace epmoe::transport::threads {
namespace {

using detail::Mailbox;
using detail::QueuedRecv;
using detail::QueuedSend;
using detail::RequestPhase;
using detail::RequestState;

class ThreadsRequest final : public Request {
 public:
  ThreadsRequest(ThreadsWorld& world, int rank, int peer, Tag tag, bool is_send, Mailbox& mailbox)
      : world_(world),
        rank_(rank),
        peer_(peer),
        tag_(tag),
        is_send_(is_send),
        mailbox_(mailbox),
        posted_at_(Clock::now()),
        timeline_(this_thread_off_timeline() ? nullptr : world.timeline()) {
    state_.on_timeline = timeline_ != nullptr;
  }

  // Cancels a request still queued; waits out a copy in progress (a memcpy on
  // another thread, not a wait on a peer), so no thread touches the buffer
  // or this state afterwards.
  ~ThreadsRequest() override {
    {
      std::unique_lock<std::mutex> lock(mailbox_.mutex);
      if (state_.phase == RequestPhase::queued) {
        const Mailbox::Key key = is_send_ ? Mailbox::Key{rank_, tag_} : Mailbox::Key{peer_, tag_};
        if (is_send_) {
          erase_state(mailbox_.unmatched_sends, key);
        } else {
          erase_state(mailbox_.unmatched_recvs, key);
        }
      } else {
        mailbox_.changed.wait(lock, [&] { return state_.phase != RequestPhase::copying; });
      }
    }
    // Last: no match can reach this request any more (a match records it in
    // the timeline's message, which must then forget it).
    if (timeline_ != nullptr) timeline_->release(state_.virtual_request);
  }

  bool test() override {
    {
      std::unique_lock<std::mutex> lock(mailbox_.mutex);
      if (!check_locked(Clock::now())) return false;
    }
    return timeline_ == nullptr || timeline_->completed_by_now(state_.virtual_request);
  }

  void wait_until(Deadline deadline) override {
    struct WaitEdge {  // this thread waits for peer_ while in scope
      ThreadsWorld& world;
      int rank, peer;
      WaitEdge(ThreadsWorld& w, int r, int p) : world(w), rank(r), peer(p) { world.begin_wait(rank, peer); }
      ~WaitEdge() { world.end_wait(rank, peer); }
    } edge(world_, rank_, peer_);
    VirtualTimeline* const timeline = timeline_;
    if (timeline != nullptr) timeline->begin_request_wait(state_.virtual_request);
    {
      std::unique_lock<std::mutex> lock(mailbox_.mutex);
      // Modelled time: a send's completion is the link's, not the receiver's,
      // and a receiver behind in virtual time may be waiting for this
      // sender's clock to move on - so the sender does not wait for the
      // receive to be posted: it leaves a copy of the bytes in the mailbox.
      if (timeline != nullptr && is_send_ && state_.phase == RequestPhase::queued) stage_locked();
      for (;;) {
        const Clock::time_point now = Clock::now();
        if (check_locked(now)) break;
        if (now >= deadline) throw_timeout(now);
        Clock::time_point wake = deadline;
        if (state_.phase == RequestPhase::done) wake = std::min(wake, state_.ready_at);
        // On a progress thread in wall time: say what wakes this sleep, so
        // that the thread that launched the collective can lend it a core
        // once it is due (transport/progress_slot.h). Modelled time waits in
        // the timeline instead, where virtual time, not a core, is the limit.
        ProgressSlot* const slot = timeline == nullptr ? this_thread_progress_slot() : nullptr;
        if (slot != nullptr) {
          slot->park(wake, &mailbox_.epoch, mailbox_.epoch.load(std::memory_order_relaxed), &mailbox_.changed);
        }
        mailbox_.changed.wait_until(lock, wake);
        if (slot != nullptr) slot->unpark();
      }
    }
    if (timeline == nullptr) return;
    // The bytes are here; wait until the timeline knows when, in virtual
    // time, they arrived (the senders behind in virtual time have caught up).
    timeline->wait_for_completion(state_.virtual_request, deadline, [&](bool timed_out) {
      std::unique_lock<std::mutex> lock(mailbox_.mutex);
      throw_if_stopped_locked();
      if (timed_out) throw_timeout(Clock::now());
    });
    timeline->end_request_wait(state_.virtual_request);
  }

  int peer() const override { return peer_; }
  Tag tag() const override { return tag_; }
  // nullptr in wall time and off the modelled timeline (OffTimelineScope).
  VirtualTimeline* timeline() const { return timeline_; }
  RequestState* state() { return &state_; }

 private:
  template <typename Queue>
  void erase_state(std::map<Mailbox::Key, std::deque<Queue>>& queues, const Mailbox::Key& key) {
    auto it = queues.find(key);
    if (it == queues.end()) return;
    auto& queue = it->second;
    queue.erase(std::remove_if(queue.begin(), queue.end(), [&](const Queue& entry) { return entry.state == &state_; }),
                queue.end());
    if (queue.empty()) queues.erase(it);
  }

  // Moves this queued send's bytes and state into its mailbox entry (above).
  // Caller holds the lock.
  void stage_locked() {
    auto found = mailbox_.unmatched_sends.find(Mailbox::Key{rank_, tag_});
    EPMOE_CHECK(found != mailbox_.unmatched_sends.end());
    for (QueuedSend& entry : found->second) {
      if (entry.state != &state_) continue;
      auto staged = std::make_shared<QueuedSend::Staged>();
      const auto* bytes = static_cast<const std::byte*>(entry.data);
      staged->bytes.assign(bytes, bytes + entry.num_bytes);
      timeline_->stage(state_.virtual_request, staged->state.virtual_request);
      staged->state.on_timeline = true;
      entry.data = staged->bytes.data();
      entry.state = &staged->state;
      entry.staged = std::move(staged);
      state_.phase = RequestPhase::done;  // the buffer is free: the mailbox holds the copy
      return;
    }
    EPMOE_CHECK(false);  // a queued send is in its mailbox
  }

  // True when complete; throws on failure or abort. Caller holds the lock.
  bool check_locked(Clock::time_point now) {
    if (state_.phase == RequestPhase::done && now >= state_.ready_at) return true;
    throw_if_stopped_locked();
    return false;
  }

  // Throws if the request failed, the group was aborted or this rank is
  // failing - whether or not its bytes have arrived (the modelled clock's
  // second wait is after they have). Caller holds the lock.
  void throw_if_stopped_locked() const {
    if (state_.phase == RequestPhase::failed) throw PeerError(state_.error);
    if (world_.aborted()) {
      throw AbortedError(
          describe_wait(rank_, is_send_ ? "aborted while sending to" : "aborted while receiving from", peer_, tag_) +
          ": " + world_.abort_reason());
    }
    if (world_.failing(rank_)) {
      throw AbortedError(describe_wait(rank_,
                                       is_send_ ? "cancelled while sending to" : "cancelled while receiving from",
                                       peer_, tag_) +
                         ": " + world_.failing_reason(rank_));
    }
  }

  [[noreturn]] void throw_timeout(Clock::time_point now) const {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - posted_at_);
    std::ostringstream what;
    what << "timed out after " << waited.count() << " ms waiting to " << (is_send_ ? "send to" : "receive from");
    world_.gave_up_waiting(rank_, peer_);
    throw PeerError(describe_wait(rank_, what.str(), peer_, tag_) + world_.late_rank_note(rank_, peer_));
  }

  ThreadsWorld& world_;
  int rank_;
  int peer_;
  Tag tag_;
  bool is_send_;
  Mailbox& mailbox_;  // the destination's mailbox: guards state_
  Clock::time_point posted_at_;
  VirtualTimeline* timeline_;
  RequestState state_;
};

// Moves one matched message. Called with `lock` held on the destination's
// mailbox and both entries already out of their queues; returns with it held.
void deliver(Mailbox& mailbox, std::unique_lock<std::mutex>& lock, const QueuedSend& send, const QueuedRecv& recv,
             int src, int dst, Tag tag, VirtualTimeline* timeline) {
  if (send.num_bytes != recv.num_bytes) {
    std::ostringstream msg;
    msg << "message size mismatch from rank " << src << " to rank " << dst << ", tag " << tag << ": " << send.num_bytes
        << " bytes sent, receive posted for " << recv.num_bytes;
    send.state->phase = RequestPhase::failed;
    send.state->error = msg.str();
    recv.state->phase = RequestPhase::failed;
    recv.state->error = msg.str();
    mailbox.notify_changed();
    return;
  }
  // Both ends on the modelled timeline or both off it (OffTimelineScope):
  // a message timed at one end only is a bug of the caller's program.
  EPMOE_CHECK_EQ(send.state->on_timeline, recv.state->on_timeline);
  send.state->phase = RequestPhase::copying;
  recv.state->phase = RequestPhase::copying;
  if (timeline != nullptr) timeline->matched(recv.state->virtual_request, send.state->virtual_request);
  lock.unlock();
  if (send.num_bytes > 0) std::memcpy(recv.data, send.data, static_cast<std::size_t>(send.num_bytes));
  lock.lock();
  send.state->phase = RequestPhase::done;
  send.state->ready_at = send.send_done;
  recv.state->phase = RequestPhase::done;
  recv.state->ready_at = send.arrival;
  mailbox.notify_changed();
  if (timeline == nullptr && send.trace.recorder != nullptr) {  // wall clock: copied now, or at the emulated arrival
    const double arrived_us =
        std::max(send.trace.recorder->wall_now_us(),
                 send.posted_us + 1e6 * std::chrono::duration<double>(send.arrival - send.posted_at).count());
    send.trace.recorder->add_message(
        src, "to rank " + std::to_string(dst), send.posted_us, arrived_us,
        {{"bytes", static_cast<double>(send.num_bytes)}, {"peer", static_cast<double>(dst)}});
  }
}

}  // namespace

ThreadsWorld::ThreadsWorld(int num_ranks, const EmulatedLinkOptions& links, const ModelledTimeOptions& modelled)
    : links_(num_ranks, links),
      failing_(static_cast<std::size_t>(std::max(num_ranks, 0))),
      failing_reasons_(static_cast<std::size_t>(std::max(num_ranks, 0))),
      waits_(static_cast<std::size_t>(std::max(num_ranks, 0)) * std::max(num_ranks, 0)),
      gave_up_(waits_.size()),
      sent_bytes_(waits_.size()) {
  if (num_ranks < 1) {
    throw ConfigError("threads transport: num_ranks = " + std::to_string(num_ranks) + ": must be >= 1");
  }
  if (modelled.enabled) {
    if (links.enabled)
      throw ConfigError(
          "clock=modelled: the wall-clock link emulation (link_bandwidth_gbps) "
          "cannot be on as well; the modelled clock uses the links itself");
    timeline_ = std::make_unique<VirtualTimeline>(num_ranks, links, modelled);
  }
  for (int rank = 0; rank < num_ranks; ++rank) {
    mailboxes_.push_back(std::make_unique<Mailbox>());
    sent_by_tag_.push_back(std::make_unique<SentByTag>());
    communicators_.push_back(std::make_unique<ThreadsCommunicator>(*this, rank));
  }
}

ThreadsWorld::~ThreadsWorld() = default;

Communicator& ThreadsWorld::communicator(int rank) {
  EPMOE_CHECK(rank >= 0 && rank < size());
  return *communicators_[rank];
}

void ThreadsWorld::abort(const std::string& reason, std::exception_ptr cause) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    abort_reason_ = reason;
    abort_cause_ = std::move(cause);
    aborted_.store(true, std::memory_order_release);
  }
  // Taking each mutex before notifying closes the window in which a waiter
  // has checked aborted() but not yet started sleeping.
  for (auto& mailbox : mailboxes_) {
    std::lock_guard<std::mutex> lock(mailbox->mutex);
    mailbox->notify_changed();
  }
  if (timeline_) timeline_->wake_all();
}

void ThreadsWorld::restart_modelled_time() {
  if (!timeline_) return;
  for (int destination = 0; destination < size(); ++destination) {
    Mailbox& mailbox = *mailboxes_[destination];
    std::lock_guard<std::mutex> lock(mailbox.mutex);
    auto refuse = [&](const char* what, const Mailbox::Key& key) {
      std::ostringstream msg;
      msg << "clock=modelled: " << what << " from rank " << key.first << " to rank " << destination << ", tag 0x"
          << std::hex << key.second
          << ", is left unmatched from the previous run; every message must be received in the run that sent it "
             "before modelled time can start afresh";
      throw UsageError(msg.str());
    };
    for (const auto& [key, sends] : mailbox.unmatched_sends) {
      if (!sends.empty()) refuse("a send", key);
    }
    for (const auto& [key, receives] : mailbox.unmatched_recvs) {
      if (!receives.empty()) refuse("a receive", key);
    }
  }
  timeline_->restart();
}

std::string ThreadsWorld::abort_reason() const {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  return abort_reason_;
}

std::exception_ptr ThreadsWorld::abort_cause() const {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  return abort_cause_;
}

void ThreadsWorld::cancel_pending(int rank, const std::string& reason) {
  EPMOE_CHECK(rank >= 0 && rank < size());
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (failing_[rank].load(std::memory_order_relaxed)) return;
    failing_reasons_[rank] = reason;
    failing_[rank].store(true, std::memory_order_release);
  }
  // The rank's receives wait in its own mailbox, its sends in the peers':
  // wake them all (as abort() does).
  for (auto& mailbox : mailboxes_) {
    std::lock_guard<std::mutex> lock(mailbox->mutex);
    mailbox->notify_changed();
  }
  if (timeline_) timeline_->wake_all();
}

std::string ThreadsWorld::failing_reason(int rank) const {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  return failing_reasons_[rank];
}

// Breadth-first from `peer` along "waits for" edges, never back to `rank`
// (which is waiting by definition): the first rank found that waits for no
// one is the one the chain is stuck behind. The counts change while we read
// them; the note is a diagnosis for the error message, not a decision.
std::string ThreadsWorld::late_rank_note(int rank, int peer) const {
  const int num_ranks = size();
  std::vector<bool> seen(static_cast<std::size_t>(num_ranks), false);
  std::vector<int> frontier = {peer};
  seen[rank] = true;
  seen[peer] = true;
  for (std::size_t i = 0; i < frontier.size(); ++i) {
    const int at = frontier[i];
    bool waits_for_someone = false;
    for (int next = 0; next < num_ranks; ++next) {
      if (waits_[edge(at, next)].load(std::memory_order_relaxed) <= 0 &&
          !gave_up_[edge(at, next)].load(std::memory_order_relaxed)) {
        continue;
      }
      waits_for_someone = true;
      if (!seen[next]) {
        seen[next] = true;
        frontier.push_back(next);
      }
    }
    if (waits_for_someone) continue;
    if (at == peer) return "; peer " + std::to_string(peer) + " is not waiting for any rank: it is the late rank";
    return "; the late rank is " + std::to_string(at) + ": peer " + std::to_string(peer) +
           " waits for it (directly or through other ranks) and it waits for no rank";
  }
  return "";  // every rank reachable is waiting: a cycle, nobody to blame
}

void ThreadsWorld::count_sent(int rank, int peer, Tag tag, std::int64_t num_bytes) {
  if (peer == rank) return;
  sent_bytes_[edge(rank, peer)].fetch_add(num_bytes, std::memory_order_relaxed);
  SentByTag& by_tag = *sent_by_tag_[rank];
  std::lock_guard<std::mutex> lock(by_tag.mutex);
  by_tag.bytes[tag] += num_bytes;
}

std::map<Tag, std::int64_t> ThreadsWorld::sent_bytes_by_tag(int rank) const {
  const SentByTag& by_tag = *sent_by_tag_[rank];
  std::lock_guard<std::mutex> lock(by_tag.mutex);
  return by_tag.bytes;
}

SentBytes ThreadsWorld::sent_bytes(int rank) const {
  SentBytes sent;
  sent.to_peer.resize(static_cast<std::size_t>(size()));
  for (int peer = 0; peer < size(); ++peer) {
    sent.to_peer[peer] = sent_bytes_[edge(rank, peer)].load(std::memory_order_relaxed);
    sent.total += sent.to_peer[peer];
  }
  return sent;
}

void ThreadsCommunicator::check_peer(int peer, Tag tag, std::int64_t num_bytes, const char* op) const {
  std::ostringstream msg;
  if (peer < 0 || peer >= size()) {
    msg << op << " on rank " << rank_ << ": peer " << peer << " outside [0, " << size() << ")";
  } else if (tag > kMaxTag) {
    msg << op << " on rank " << rank_ << ": tag " << tag << " > kMaxTag " << kMaxTag;
  } else if (num_bytes < 0) {
    msg << op << " on rank " << rank_ << ": num_bytes = " << num_bytes << " < 0";
  } else {
    return;
  }
  throw ConfigError(msg.str());
}

std::unique_ptr<Request> ThreadsCommunicator::isend(int peer, Tag tag, const void* data, std::int64_t num_bytes) {
  check_peer(peer, tag, num_bytes, "isend");
  count_bytes_sent(num_bytes);
  world_.count_sent(rank_, peer, tag, num_bytes);
  const Clock::time_point posted_at = Clock::now();
  const LinkTiming timing = world_.links().reserve(rank_, peer, num_bytes, posted_at);
  Mailbox& mailbox = world_.mailbox(peer);
  auto request = std::make_unique<ThreadsRequest>(world_, rank_, peer, tag, /*is_send=*/true, mailbox);
  VirtualTimeline* const timeline = request->timeline();
  if (timeline != nullptr) timeline->post_send(rank_, peer, num_bytes, request->state()->virtual_request);
  const TraceTrack trace = this_thread_trace_track();
  const QueuedSend send{data,
                        num_bytes,
                        timing.send_done,
                        timing.arrival,
                        request->state(),
                        trace,
                        trace.recorder != nullptr ? trace.recorder->wall_now_us() : 0.0,
                        posted_at,
                        /*staged=*/nullptr};
  const Mailbox::Key key{rank_, tag};

  std::unique_lock<std::mutex> lock(mailbox.mutex);
  auto it = mailbox.unmatched_recvs.find(key);
  if (it == mailbox.unmatched_recvs.end()) {
    mailbox.unmatched_sends[key].push_back(send);
    return request;
  }
  const QueuedRecv recv = it->second.front();
  it->second.pop_front();
  if (it->second.empty()) mailbox.unmatched_recvs.erase(it);
  deliver(mailbox, lock, send, recv, rank_, peer, tag, timeline);
  return request;
}

std::unique_ptr<Request> ThreadsCommunicator::irecv(int peer, Tag tag, void* data, std::int64_t num_bytes) {
  check_peer(peer, tag, num_bytes, "irecv");
  Mailbox& mailbox = world_.mailbox(rank_);
  auto request = std::make_unique<ThreadsRequest>(world_, rank_, peer, tag, /*is_send=*/false, mailbox);
  const QueuedRecv recv{data, num_bytes, request->state()};
  const Mailbox::Key key{peer, tag};

  std::unique_lock<std::mutex> lock(mailbox.mutex);
  auto it = mailbox.unmatched_sends.find(key);
  if (it == mailbox.unmatched_sends.end()) {
    mailbox.unmatched_recvs[key].push_back(recv);
    return request;
  }
  const QueuedSend send = it->second.front();
  it->second.pop_front();
  if (it->second.empty()) mailbox.unmatched_sends.erase(it);
  deliver(mailbox, lock, send, recv, peer, rank_, tag, request->timeline());
  return request;
}

}  // namespace epmoe::transport::threads
