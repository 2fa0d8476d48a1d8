#include "transport/threads/rank_threads.h"

#include <string>

#include "core/error.h"
#include "transport/threads/rank_run.h"

namespace epmoe::transport::threads {
namespace {

// Holds RankThreads' in_use_ flag for one call; refuses a second call while
// one is in progress.
class InUse {
 public:
  InUse(std::atomic<bool>& flag, const char* call) : flag_(flag) {
    if (flag_.exchange(true, std::memory_order_acq_rel)) {
      throw UsageError(std::string("RankThreads::") + call +
                       ": called while a run is in progress (from a rank's job, or from a second thread); one call "
                       "at a time, never from inside a job");
    }
  }
  ~InUse() { flag_.store(false, std::memory_order_release); }
  InUse(const InUse&) = delete;
  InUse& operator=(const InUse&) = delete;

 private:
  std::atomic<bool>& flag_;
};

}  // namespace

RankThreads::RankThreads(int num_ranks, const ThreadsOptions& options)
    : options_(options), compute_threads_per_rank_(compute_threads_per_rank(options, num_ranks)) {
  options_.validate();
  world_ = std::make_unique<ThreadsWorld>(num_ranks, options_.links, options_.modelled);
  threads_.reserve(static_cast<std::size_t>(num_ranks));
  try {
    for (int rank = 0; rank < num_ranks; ++rank) threads_.emplace_back([this, rank] { serve(rank); });
  } catch (...) {
    stop_threads();  // the ones that did start
    throw;
  }
}

RankThreads::~RankThreads() { stop_threads(); }

void RankThreads::stop_threads() noexcept {
  stopping_ = true;
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

void RankThreads::serve(int rank) {
  std::uint32_t seen = 0;
  for (;;) {
    generation_.wait(seen, std::memory_order_acquire);
    seen = generation_.load(std::memory_order_acquire);
    if (stopping_) return;
    run_->run_rank(rank, *job_);
    // The last rank to finish wakes the caller.
    if (num_running_.fetch_sub(1, std::memory_order_acq_rel) == 1) num_running_.notify_one();
  }
}

std::string RankThreads::broken_reason() const {
  if (world_->aborted()) return "the world was aborted in an earlier run (" + world_->abort_reason() + ")";
  for (int rank = 0; rank < world_->size(); ++rank) {
    if (world_->failing(rank)) {
      return "rank " + std::to_string(rank) + "'s waits were cancelled in an earlier run (" +
             world_->failing_reason(rank) + ")";
    }
  }
  return "";
}

bool RankThreads::needs_restart() const { return !broken_reason().empty(); }

void RankThreads::run(const std::function<void(Communicator&)>& fn) {
  InUse in_use(in_use_, "run");
  if (const std::string reason = broken_reason(); !reason.empty()) {
    throw UsageError("RankThreads::run: " + reason +
                     "; call restart() for a fresh world (the old world's communicators are then invalid)");
  }
  world_->restart_modelled_time();
  RankRun run(*world_, options_.trace, compute_threads_per_rank_);
  job_ = &fn;
  run_ = &run;
  num_running_.store(static_cast<std::uint32_t>(size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::uint32_t running = num_running_.load(std::memory_order_acquire); running != 0;
       running = num_running_.load(std::memory_order_acquire)) {
    num_running_.wait(running, std::memory_order_acquire);
  }
  job_ = nullptr;
  run_ = nullptr;
  run.rethrow_root_error();
}

void RankThreads::restart() {
  InUse in_use(in_use_, "restart");
  auto fresh = std::make_unique<ThreadsWorld>(size(), options_.links, options_.modelled);
  world_ = std::move(fresh);
}

}  // namespace epmoe::transport::threads
