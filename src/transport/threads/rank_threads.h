// RankThreads: the ranks-as-threads launcher kept alive between calls, for
// callers that run the same world many times (the whole-world layer runner
// calls it once per layer call; starting R threads and a world per call, as
// run_ranks does, costs more than a small layer's own compute). R threads are
// started once, thread r bound to rank r of one ThreadsWorld; run(fn) runs
// fn(communicator(r)) on every rank's thread and returns when all returned.
// A run creates no thread and (in wall time) allocates nothing: the caller
// publishes the job and bumps a generation counter the rank threads sleep on
// (std::atomic::wait, a futex on Linux), then sleeps on a count of running
// ranks that the last one to finish wakes. bench/transport/
// rank_threads_bench.cc measures the round trip of an empty run against
// run_ranks' start-up.
//
// Per run, as run_ranks does per rank thread (threads/rank_run.h): the rank's
// modelled clock and trace track installed, its compute budget set (a job may
// change its thread's budget; each run starts from options'), the rank
// finished on the virtual timeline at the end. Errors are those of run_ranks:
// a rank's exception aborts the world, every rank ends, and the root error is
// rethrown from run(), never an AbortedError when a real error exists.
//
// Modelled time (options.modelled.enabled): each run starts modelled time
// afresh (ThreadsWorld::restart_modelled_time), so a run's modelled times are
// those of run_ranks with the same options, run after run. Between runs no
// message may be left unmatched and no collective in flight (UsageError at
// the next run). In wall time, state may be kept between runs on the
// communicators (a message sent in one run and received in the next).
//
// After a failure: the world is aborted for good (its waits throw
// AbortedError), so run() refuses with a UsageError carrying the abort's
// reason until restart(), which puts a fresh world (same options) under the
// same threads. Every Communicator& (and whatever the owner built on one)
// from before restart() is invalid after it: the owner rebuilds its per-rank
// state in its next run. The same holds when a rank's waits were cancelled
// (Communicator::cancel_pending) in a run that still returned.
//
// Threading: one run() at a time; run() or restart() from inside a rank's
// job, or while another thread's run() is in progress, throws UsageError.
// The caller waits for the ranks without a deadline, as run_ranks joins its
// threads: every wait inside a job has its own (comm/collective_handle.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "transport/communicator.h"
#include "transport/threads/communicator.h"
#include "transport/threads/launcher.h"

namespace epmoe::transport::threads {

class RankRun;

class RankThreads {
 public:
  // Validates `options` (ConfigError) and starts `num_ranks` threads on a
  // new ThreadsWorld(num_ranks, options.links, options.modelled).
  // options.trace, when set, must outlive this.
  RankThreads(int num_ranks, const ThreadsOptions& options);
  ~RankThreads();  // ends and joins the threads; never throws
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return world_->size(); }

  // Runs fn(world().communicator(r)) on rank r's thread for every rank and
  // returns when all have returned; rethrows the root error if one threw.
  void run(const std::function<void(Communicator&)>& fn);

  // True once the world is unusable (a run failed): run() refuses until
  // restart().
  bool needs_restart() const;
  // A fresh world with the same options under the same threads.
  void restart();

  // The current world (replaced by restart()): its communicators are the
  // ones the ranks' jobs get.
  ThreadsWorld& world() { return *world_; }

 private:
  void serve(int rank);
  void stop_threads() noexcept;
  // Why the world cannot run again ("" when it can).
  std::string broken_reason() const;

  ThreadsOptions options_;
  int compute_threads_per_rank_;
  std::unique_ptr<ThreadsWorld> world_;
  std::atomic<bool> in_use_{false};  // a run() or restart() is in progress
  // The run in progress, published to the rank threads by the release bump
  // of generation_ and read by them after their acquire; written only while
  // no rank thread runs.
  const std::function<void(Communicator&)>* job_ = nullptr;
  RankRun* run_ = nullptr;
  bool stopping_ = false;                      // likewise published by the last bump
  std::atomic<std::uint32_t> generation_{0};   // bumped once per run (and at stop): the rank threads wait on it
  std::atomic<std::uint32_t> num_running_{0};  // ranks still in the current run: the caller waits on it
  std::vector<std::thread> threads_;           // [rank]; last: started once the members above exist
};

}  // namespace epmoe::transport::threads
