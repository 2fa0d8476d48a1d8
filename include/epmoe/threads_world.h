// R ranks as threads of this process, on the threads transport (DESIGN.md
// §4.4): messages between ranks are copies between the threads' buffers. For
// tests and single-machine use of anything written against
// epmoe::Communicator (<epmoe/communicator.h>).
//
// Two ways in:
//   * run_ranks(R, fn): runs fn(communicator) on R threads, one per rank (rank
//     0 on the calling thread), and returns when all returned. If fn throws
//     on a rank, the world is aborted with "rank r failed: <what>", every
//     other rank's waits wake with an AbortedError carrying that text, and
//     once every rank has ended the root error is rethrown here (never an
//     AbortedError when a real error exists). Each rank thread gets
//     compute_threads_per_rank compute threads (OpenMP), or max(1, cores / R)
//     when that is 0, so the R ranks share the machine's cores instead of
//     oversubscribing them.
//   * ThreadsWorld: the world alone, for callers that run their own threads.
//     Give communicator(r) to the thread of rank r. A thread whose rank fails
//     must call communicator(r).abort(reason) so that the other ranks' waits
//     wake instead of running into their deadlines.
//
// Public and std-only.
#pragma once

#include <functional>
#include <memory>

#include <epmoe/communicator.h>

namespace epmoe {

namespace transport::threads {
class ThreadsWorld;  // internal: the transport's shared state
}  // namespace transport::threads

class ThreadsWorld {
 public:
  // ConfigError unless num_ranks >= 1.
  explicit ThreadsWorld(int num_ranks);
  ~ThreadsWorld();
  ThreadsWorld(const ThreadsWorld&) = delete;
  ThreadsWorld& operator=(const ThreadsWorld&) = delete;

  int size() const;
  // The communicator of rank `rank` (ConfigError outside [0, size())); owned
  // by the world, which must outlive every use of it and every Request
  // posted through it.
  Communicator& communicator(int rank);
  // True once a rank aborted the world (Communicator::abort): every wait then
  // throws AbortedError.
  bool aborted() const;

 private:
  std::unique_ptr<transport::threads::ThreadsWorld> world_;
};

// compute_threads_per_rank: 0 = max(1, cores / num_ranks); ConfigError if < 0
// or num_ranks < 1.
void run_ranks(int num_ranks, const std::function<void(Communicator&)>& fn, int compute_threads_per_rank = 0);

}  // namespace epmoe
