// The threads transport: R ranks as threads of one process, exchanging
// messages through shared-memory mailboxes (threads/mailbox.h), optionally
// slowed to emulated link speeds (threads/emulated_links.h). The embedded
// default and the test harness (DESIGN.md §4.4). Usually created through
// run_ranks (threads/launcher.h).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/communicator.h"
#include "transport/threads/emulated_links.h"
#include "transport/threads/mailbox.h"
#include "transport/threads/virtual_timeline.h"

namespace epmoe::transport::threads {

class ThreadsCommunicator;

// The state the R ranks share. Owns the mailboxes, the links and the R
// communicators; must outlive every Request posted through them.
// Lock order: a mailbox mutex may be taken while holding nothing else, or
// before EmulatedLinks' or the VirtualTimeline's mutex (the timeline's is
// never held while taking a mailbox's); abort_mutex_ is never held while
// taking a mailbox mutex (it may be taken while holding one).
//
// clock=modelled (ModelledTimeOptions::enabled): the world owns a
// VirtualTimeline (threads/virtual_timeline.h); requests then complete at
// their virtual times, and a send no longer waits for its receive to be
// posted (its bytes are staged in the mailbox, threads/mailbox.h).
//
// Late rank: the world counts, per (rank, peer), the threads of `rank` that
// are blocked in a wait for `peer`. A wait that times out follows these edges
// from its peer to a rank that waits for no one - the rank the others are
// stuck behind - and names it, rather than only the ring neighbour it waited
// for (late_rank_note()).
class ThreadsWorld {
 public:
  ThreadsWorld(int num_ranks, const EmulatedLinkOptions& links, const ModelledTimeOptions& modelled = {});
  ~ThreadsWorld();
  ThreadsWorld(const ThreadsWorld&) = delete;
  ThreadsWorld& operator=(const ThreadsWorld&) = delete;

  int size() const { return static_cast<int>(mailboxes_.size()); }
  Communicator& communicator(int rank);

  // First reason wins; wakes every waiter of every rank.
  void abort(const std::string& reason, std::exception_ptr cause = nullptr);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() const;
  std::exception_ptr abort_cause() const;  // the first abort's cause, if it gave one

  // Rank `rank` is failing: fails its pending and later waits (first reason wins).
  void cancel_pending(int rank, const std::string& reason);
  bool failing(int rank) const { return failing_[rank].load(std::memory_order_acquire); }
  std::string failing_reason(int rank) const;

  // The wait-for edges (see above): a thread of `rank` starts / stops waiting for `peer`.
  void begin_wait(int rank, int peer) { waits_[edge(rank, peer)].fetch_add(1, std::memory_order_relaxed); }
  void end_wait(int rank, int peer) { waits_[edge(rank, peer)].fetch_sub(1, std::memory_order_relaxed); }
  // A wait of `rank` on `peer` timed out. The edge stays in the graph: that
  // rank is stuck behind `peer` for good, and a neighbour's timeout a moment
  // later must still see the chain through it (its wait has ended by then).
  void gave_up_waiting(int rank, int peer) { gave_up_[edge(rank, peer)].store(true, std::memory_order_relaxed); }
  // For a wait of `rank` on `peer` that timed out: "" when no rank can be
  // blamed, else "; ..." naming the late rank.
  std::string late_rank_note(int rank, int peer) const;

  detail::Mailbox& mailbox(int rank) { return *mailboxes_[rank]; }
  EmulatedLinks& links() { return links_; }
  // clock=modelled: the virtual timeline; nullptr in wall time.
  VirtualTimeline* timeline() { return timeline_.get(); }
  // clock=modelled, between two runs on these ranks (threads/rank_threads.h):
  // modelled time starts afresh (VirtualTimeline::restart). Throws
  // UsageError naming ranks and tag when a message of the previous run is
  // still unmatched (its modelled times belong to that run), or a collective
  // is still in flight. No-op in wall time.
  void restart_modelled_time();

  // Payload bytes `rank` posted to `peer` (Communicator::sent_bytes), and by
  // tag for tests that tell a collective's streams apart (comm/tag.h); a
  // send to self is not counted.
  void count_sent(int rank, int peer, Tag tag, std::int64_t num_bytes);
  SentBytes sent_bytes(int rank) const;
  std::map<Tag, std::int64_t> sent_bytes_by_tag(int rank) const;

 private:
  std::vector<std::unique_ptr<detail::Mailbox>> mailboxes_;  // [destination rank]
  EmulatedLinks links_;
  std::unique_ptr<VirtualTimeline> timeline_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex abort_mutex_;  // guards abort_reason_, abort_cause_
  std::string abort_reason_;
  std::exception_ptr abort_cause_;
  std::vector<std::atomic<bool>> failing_;             // [rank]
  std::vector<std::string> failing_reasons_;           // [rank], guarded by abort_mutex_
  std::vector<std::atomic<int>> waits_;                // [rank * R + peer]: threads of rank waiting for peer
  std::vector<std::atomic<bool>> gave_up_;             // [rank * R + peer]: a wait of rank on peer timed out
  std::vector<std::atomic<std::int64_t>> sent_bytes_;  // [rank * R + peer]: payload bytes rank posted to peer
  struct SentByTag {
    mutable std::mutex mutex;  // a leaf: nothing is taken while it is held
    std::map<Tag, std::int64_t> bytes;
  };
  std::vector<std::unique_ptr<SentByTag>> sent_by_tag_;              // [rank]: payload bytes to other ranks, by tag
  std::vector<std::unique_ptr<ThreadsCommunicator>> communicators_;  // [rank]

  std::size_t edge(int rank, int peer) const { return static_cast<std::size_t>(rank) * size() + peer; }
};

class ThreadsCommunicator final : public Communicator {
 public:
  ThreadsCommunicator(ThreadsWorld& world, int rank) : world_(world), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return world_.size(); }
  std::string_view transport_name() const override { return "threads"; }
  std::unique_ptr<Request> isend(int peer, Tag tag, const void* data, std::int64_t num_bytes) override;
  std::unique_ptr<Request> irecv(int peer, Tag tag, void* data, std::int64_t num_bytes) override;
  void abort(const std::string& reason, std::exception_ptr cause = nullptr) override {
    world_.abort(reason, std::move(cause));
  }
  void cancel_pending(const std::string& reason) override { world_.cancel_pending(rank_, reason); }
  // None off the modelled timeline (core/modelled_clock.h's OffTimelineScope).
  CollectiveClocks* collective_clocks() override { return this_thread_off_timeline() ? nullptr : world_.timeline(); }
  std::optional<SentBytes> sent_bytes() const override { return world_.sent_bytes(rank_); }
  // Test hook: this rank's SentBytes::total split by tag.
  std::map<Tag, std::int64_t> sent_bytes_by_tag() const { return world_.sent_bytes_by_tag(rank_); }

 private:
  void check_peer(int peer, Tag tag, std::int64_t num_bytes, const char* op) const;

  ThreadsWorld& world_;  // not owned; owns this
  int rank_;
};

}  // namespace epmoe::transport::threads
