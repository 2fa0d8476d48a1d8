// run_ranks: the ranks-as-threads launcher (gloo's test harness shape). Runs
// fn(communicator) on `num_ranks` threads of this process, one per rank, and
// returns when all have returned.
//
// Cores: the R ranks share this machine's cores, so each rank thread sets its
// own OpenMP compute budget (core/threading.h) to
// options.compute_threads_per_rank, or max(1, hardware_cores() / R) when that
// is 0, instead of R x cores threads oversubscribing the machine.
//
// Failure: if fn throws on any rank, the world is aborted with
// "rank r failed: <what>" (the first reason wins), which wakes every other
// rank's waits with an AbortedError carrying that text (no deadlock, no wait
// past its timeout). Once all threads have ended, the root-cause exception is
// rethrown here (threads/rank_run.h says which): a peer woken by the abort
// never masks the error that caused it.
//
// Threads are started per call; threads/rank_threads.h keeps them between
// calls.
#pragma once

#include <functional>

#include "core/trace_recorder.h"
#include "transport/communicator.h"
#include "transport/threads/emulated_links.h"
#include "transport/threads/virtual_timeline.h"

namespace epmoe::transport::threads {

// Modelled time: with modelled.enabled each rank thread runs on its rank's
// virtual clock (threads/virtual_timeline.h) and `links` describes the
// modelled links. Tracing: with `trace` set, each rank thread records its
// phases, compute and collectives there as process `rank`.
struct ThreadsOptions {
  EmulatedLinkOptions links = {};
  int compute_threads_per_rank = 0;  // 0: max(1, hardware_cores() / num_ranks)
  ModelledTimeOptions modelled = {};
  TraceRecorder* trace = nullptr;  // not owned

  void validate() const;  // throws ConfigError
};

// The compute threads each of `num_ranks` rank threads gets (above).
int compute_threads_per_rank(const ThreadsOptions& options, int num_ranks);

void run_ranks(int num_ranks, const ThreadsOptions& options, const std::function<void(Communicator&)>& fn);

}  // namespace epmoe::transport::threads
