// The transport interface every collective in comm/ is written against:
// tagged, asynchronous point-to-point byte messages between the ranks of a
// group, with a deadline on every wait (DESIGN.md §4.4).
//
// Matching rule (both transports, as MPI's non-overtaking rule): a receive
// posted for (peer, tag) matches the oldest unmatched send from that peer with
// that tag; messages with equal (peer, tag) are received in the order they were
// sent. A receive must be posted for exactly the number of bytes sent; a size
// mismatch fails both requests with a PeerError naming peer, tag and sizes.
//
// Errors: a wait that passes its deadline, or that is woken by abort(), throws
// epmoe::PeerError whose message names this rank, the peer and the tag.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace epmoe::transport {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Raw message tag. 31 bits so that it fits MPI's tag range (OpenMPI's
// MPI_TAG_UB is 2^31 - 1); comm/tag.h documents how collectives fill it.
using Tag = std::uint32_t;
constexpr Tag kMaxTag = (Tag{1} << 31) - 1;

class NativeCollectives;

// One posted send or receive. Move-only handle, owned by whoever posted it.
// The buffer passed to isend/irecv must stay valid (and, for a send, unchanged)
// until test() returned true, wait_until() returned, or the Request was
// destroyed. Destroying a Request that has not completed cancels it (threads)
// or releases it to MPI (mpi; only sensible after a failure).
class Request {
 public:
  virtual ~Request() = default;
  // True once the message has been delivered (for a send: once its buffer may
  // be reused). Throws PeerError if the request failed or the group aborted.
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
  virtual std::unique_ptr<Request> isend(int peer, Tag tag, const void* data,
                                         std::int64_t num_bytes) = 0;
  // Posts a receive of exactly `num_bytes` bytes from `peer` into `data`.
  virtual std::unique_ptr<Request> irecv(int peer, Tag tag, void* data,
                                         std::int64_t num_bytes) = 0;

  // Fails the whole group with `reason`: every rank's pending and future waits
  // throw PeerError carrying it (threads), or the job ends through MPI_Abort
  // after printing it (mpi). Called by the launchers when a rank throws; safe
  // to call from any thread, more than once (the first reason wins).
  virtual void abort(const std::string& reason) = 0;

  // The transport's own collectives (MPI's), for algorithm=native; nullptr when
  // the transport has none (threads).
  virtual NativeCollectives* native_collectives() { return nullptr; }
};

// "rank 2: <what> peer 3, tag 0x1234" - the common prefix of transport errors.
std::string describe_wait(int rank, std::string_view what, int peer, Tag tag);

}  // namespace epmoe::transport
