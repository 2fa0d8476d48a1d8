// <epmoe/threads_world.h> over the threads transport (threads/communicator.h,
// threads/launcher.h).
#include <epmoe/threads_world.h>

#include <string>

#include "core/error.h"
#include "transport/threads/communicator.h"
#include "transport/threads/launcher.h"

namespace epmoe {

ThreadsWorld::ThreadsWorld(int num_ranks)
    : world_(std::make_unique<transport::threads::ThreadsWorld>(num_ranks, transport::threads::EmulatedLinkOptions{})) {
}

ThreadsWorld::~ThreadsWorld() = default;

int ThreadsWorld::size() const { return world_->size(); }

Communicator& ThreadsWorld::communicator(int rank) {
  if (rank < 0 || rank >= size()) {
    throw ConfigError("ThreadsWorld::communicator: rank " + std::to_string(rank) + " outside [0, " +
                      std::to_string(size()) + ")");
  }
  return world_->communicator(rank);
}

bool ThreadsWorld::aborted() const { return world_->aborted(); }

void run_ranks(int num_ranks, const std::function<void(Communicator&)>& fn, int compute_threads_per_rank) {
  transport::threads::ThreadsOptions options;
  options.compute_threads_per_rank = compute_threads_per_rank;
  transport::threads::run_ranks(num_ranks, options, fn);
}

}  // namespace epmoe
