// One run of a function on every rank of a ThreadsWorld, as both threads
// launchers do it (run_ranks, threads/launcher.h: fresh threads per run;
// RankThreads, threads/rank_threads.h: threads kept between runs): what a
// rank thread does around the function, and which error the launcher
// rethrows once every rank has ended.
//
// Around the function, on the rank's thread: the rank's modelled clock and
// trace track installed (the previous ones restored after), its compute
// budget set (core/threading.h), and, once the function returned or threw,
// the rank finished on the virtual timeline, so that it holds back nobody's
// virtual time.
//
// Failure: a rank whose function throws aborts the world with
// "rank r failed: <what>" (first reason wins), waking every other rank. The
// error rethrown: the cause of the first abort (a rank's exception, or the
// error a collective's algorithm threw on a progress thread, comm/
// collective_handle.h), else the first exception that is not an
// AbortedError, else the first of any kind - a peer woken by the abort never
// masks the error that caused it.
#pragma once

#include <exception>
#include <functional>
#include <mutex>

#include "core/trace_recorder.h"
#include "transport/communicator.h"
#include "transport/threads/communicator.h"

namespace epmoe::transport::threads {

class RankRun {
 public:
  // `world` and `trace` (may be nullptr) outlive the run.
  RankRun(ThreadsWorld& world, TraceRecorder* trace, int compute_threads_per_rank)
      : world_(world), trace_(trace), compute_threads_per_rank_(compute_threads_per_rank) {}
  RankRun(const RankRun&) = delete;
  RankRun& operator=(const RankRun&) = delete;

  // Runs fn(world.communicator(rank)) on the calling thread (above). Never
  // throws: the error is recorded for rethrow_root_error().
  void run_rank(int rank, const std::function<void(Communicator&)>& fn) noexcept;

  // Once every rank's run_rank has returned: rethrows the root error, if any
  // rank failed.
  void rethrow_root_error() const;

 private:
  ThreadsWorld& world_;
  TraceRecorder* trace_;
  int compute_threads_per_rank_;
  mutable std::mutex first_error_mutex_;  // guards first_error_, first_root_error_
  std::exception_ptr first_error_;
  std::exception_ptr first_root_error_;
};

}  // namespace epmoe::transport::threads
