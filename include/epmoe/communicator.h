// epmoe::Communicator: the transport every epmoe collective is written
// against - tagged, asynchronous point-to-point byte messages between the
// ranks of a group, with a deadline on every wait (DESIGN.md §4.4). An EP
// group (<epmoe/ep_group.h>) runs on one. Get one from
//   * <epmoe/threads_world.h>: R ranks as threads of this process;
//   * <epmoe/mpi_communicator.h>: the processes of the caller's MPI_Comm;
// or implement the interface over your own transport (isend, irecv, abort,
// cancel_pending; the rest has defaults).
//
// Matching rule (as MPI's non-overtaking rule): a receive posted for (peer,
// tag) matches the oldest unmatched send from that peer with that tag;
// messages with equal (peer, tag) are received in the order they were sent.
// A receive must be posted for exactly the number of bytes sent; a size
// mismatch fails both requests with a PeerError naming peer, tag and sizes.
//
// Errors: a wait that passes its deadline throws epmoe::PeerError whose
// message names this rank, the peer and the tag (and, where the transport
// can tell, the late rank the wait is stuck behind). A wait woken by abort()
// or cancel_pending() throws AbortedError, a PeerError that marks a
// consequence of a failure elsewhere, so launchers can report the root cause
// instead.
//
// Public and std-only.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <epmoe/error.h>

namespace epmoe {

namespace transport {
class NativeCollectives;  // internal: MPI's own collectives, for comparisons
class CollectiveClocks;   // internal: the modelled clock (clock=modelled)
}  // namespace transport

// A wait that failed because the group was aborted or this rank is failing:
// never the root cause of a failure, always a consequence of one (whose text
// it carries).
class AbortedError : public PeerError {
 public:
  using PeerError::PeerError;
};

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Raw message tag. 31 bits so that it fits MPI's tag range (OpenMPI's
// MPI_TAG_UB is 2^31 - 1); epmoe's collectives fill it as src/comm/tag.h
// documents.
using Tag = std::uint32_t;
constexpr Tag kMaxTag = (Tag{1} << 31) - 1;

// The payload bytes one rank has sent to the other ranks, as the transport
// counted them in isend: the bytes of the callers' buffers (the threads
// transport's messages carry no header of their own; its matching metadata
// is not counted). A send to self is not a transfer and is never counted.
struct SentBytes {
  std::vector<std::int64_t> to_peer;  // [peer]; to_peer[rank] stays 0
  std::int64_t total = 0;             // the sum over peers
};

// One posted send or receive. Move-only handle, owned by whoever posted it.
// The buffer passed to isend/irecv must stay valid (and, for a send,
// unchanged) until test() returned true, wait_until() returned, or the
// Request was destroyed. Destroying a Request that has not completed
// cancels it (threads) or releases it to MPI (mpi; only sensible after a
// failure).
class Request {
 public:
  virtual ~Request() = default;
  // True once the message has been delivered (for a send: once its buffer
  // may be reused). Throws PeerError if the request failed or the group
  // aborted.
  virtual bool test() = 0;
  // Blocks until completion or `deadline`; throws PeerError on timeout, on
  // failure and on abort.
  virtual void wait_until(Deadline deadline) = 0;

  void wait(std::chrono::milliseconds timeout) { wait_until(Clock::now() + timeout); }

  virtual int peer() const = 0;
  virtual Tag tag() const = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "threads" or "mpi", for messages and benchmark tables.
  virtual std::string_view transport_name() const = 0;

  // Posts a send of `num_bytes` bytes from `data` to `peer` (0 bytes and
  // peer == rank() allowed). Returns at once. isend and irecv may be called
  // from several threads at once (a rank's own thread and the progress
  // threads of its collectives).
  virtual std::unique_ptr<Request> isend(int peer, Tag tag, const void* data, std::int64_t num_bytes) = 0;
  // Posts a receive of exactly `num_bytes` bytes from `peer` into `data`.
  virtual std::unique_ptr<Request> irecv(int peer, Tag tag, void* data, std::int64_t num_bytes) = 0;

  // Fails the whole group with `reason`: every rank's pending and future
  // waits throw AbortedError carrying it (threads), or the job ends through
  // MPI_Abort after printing it (mpi). Called by the launchers when a rank
  // throws and by a collective whose algorithm fails; safe to call from any
  // thread, more than once (the first reason wins). `cause`, the exception
  // behind the reason, lets the threads launcher rethrow the root error even
  // when it was thrown on a progress thread and never reached a caller.
  virtual void abort(const std::string& reason, std::exception_ptr cause = nullptr) = 0;

  // This rank is failing (an exception is unwinding through a collective in
  // flight): wakes every pending wait on this rank's requests and fails it,
  // and every later one, with AbortedError carrying `reason`, so the rank's
  // progress threads let go at once instead of at their deadlines. Peers are
  // not told; the launcher aborts the group with the root error. Safe from
  // any thread, more than once (the first reason wins).
  virtual void cancel_pending(const std::string& reason) = 0;

  // The transport's own collectives (MPI's), for algorithm=native; nullptr
  // when the transport has none (threads, a caller's own transport).
  virtual transport::NativeCollectives* native_collectives() { return nullptr; }

  // The modelled clocks collectives run on (clock=modelled); nullptr in wall
  // time.
  virtual transport::CollectiveClocks* collective_clocks() { return nullptr; }

  // SentBytes of this rank since the communicator was made (every thread's
  // sends: the rank's own and its collectives' progress threads); a send
  // counts once posted. std::nullopt when the transport does not count (mpi).
  virtual std::optional<SentBytes> sent_bytes() const { return std::nullopt; }
};

}  // namespace epmoe
