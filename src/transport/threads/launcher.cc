#include "transport/threads/launcher.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/threading.h"
#include "transport/threads/communicator.h"
#include "transport/threads/rank_run.h"

namespace epmoe::transport::threads {

void ThreadsOptions::validate() const {
  links.validate();
  modelled.validate();
  if (compute_threads_per_rank < 0) {
    throw ConfigError("compute_threads_per_rank = " + std::to_string(compute_threads_per_rank) +
                      ": must be >= 0 (0 = cores / ranks)");
  }
}

int compute_threads_per_rank(const ThreadsOptions& options, int num_ranks) {
  if (options.compute_threads_per_rank > 0) return options.compute_threads_per_rank;
  return std::max(1, hardware_cores() / std::max(1, num_ranks));
}

void run_ranks(int num_ranks, const ThreadsOptions& options, const std::function<void(Communicator&)>& fn) {
  options.validate();
  ThreadsWorld world(num_ranks, options.links, options.modelled);
  RankRun run(world, options.trace, compute_threads_per_rank(options, num_ranks));
  std::vector<std::thread> threads;
  threads.reserve(num_ranks);
  for (int rank = 1; rank < num_ranks; ++rank) threads.emplace_back([&, rank] { run.run_rank(rank, fn); });
  // Rank 0 runs on the calling thread (R=1 starts no thread); the caller's
  // own compute budget is restored afterwards.
  const int caller_compute_threads = compute_threads();
  run.run_rank(0, fn);
  set_compute_threads(caller_compute_threads);
  for (auto& thread : threads) thread.join();
  run.rethrow_root_error();
}

}  // namespace epmoe::transport::threads
