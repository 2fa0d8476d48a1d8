#include "transport/threads/launcher.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/threading.h"
#include "transport/threads/communicator.h"

namespace epmoe::transport::threads {
namespace {

std::string describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

void ThreadsOptions::validate() const {
  links.validate();
  modelled.validate();
  if (compute_threads_per_rank < 0) {
    throw ConfigError("compute_threads_per_rank = " + std::to_string(compute_threads_per_rank) +
                      ": must be >= 0 (0 = cores / ranks)");
  }
}

void run_ranks(int num_ranks, const ThreadsOptions& options, const std::function<void(Communicator&)>& fn) {
  options.validate();
  ThreadsWorld world(num_ranks, options.links, options.modelled);
  const int threads_per_rank = options.compute_threads_per_rank > 0 ? options.compute_threads_per_rank
                                                                    : std::max(1, hardware_cores() / num_ranks);

  // The error rethrown: the first abort's cause, else the first root cause
  // (not an AbortedError, which only says that some other rank failed), else
  // the first error of any kind. A rank woken by the abort may record its
  // AbortedError before the failing rank's own exception arrives here.
  std::mutex first_error_mutex;  // guards first_error, first_root_error
  std::exception_ptr first_error, first_root_error;
  auto run_one = [&](int rank) {
    VirtualTimeline* timeline = world.timeline();
    // The rank's clock and trace track for the thread's lifetime; a rank
    // that has returned (or thrown) holds back nobody's virtual time.
    struct RankThreadScope {
      VirtualTimeline* timeline;
      int rank;
      ModelledClock* previous_clock;
      TraceTrack previous_track;
      RankThreadScope(VirtualTimeline* t, int r, TraceRecorder* trace)
          : timeline(t),
            rank(r),
            previous_clock(set_this_thread_modelled_clock(t != nullptr ? &t->rank_clock(r) : nullptr)),
            previous_track(set_this_thread_trace_track({trace, r})) {}
      ~RankThreadScope() {
        if (timeline != nullptr) timeline->finish_rank(rank);
        set_this_thread_modelled_clock(previous_clock);
        set_this_thread_trace_track(previous_track);
      }
    } scope(timeline, rank, options.trace);
    try {
      set_compute_threads(threads_per_rank);
      fn(world.communicator(rank));
    } catch (const AbortedError& e) {
      {
        std::lock_guard<std::mutex> lock(first_error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
      // Usually a no-op (the group is aborted already, first reason wins);
      // it matters only if this rank's waits were cancelled and no abort
      // followed.
      world.abort("rank " + std::to_string(rank) + " failed: " + e.what());
    } catch (...) {
      const std::exception_ptr error = std::current_exception();
      {
        std::lock_guard<std::mutex> lock(first_error_mutex);
        if (!first_error) first_error = error;
        if (!first_root_error) first_root_error = error;
      }
      world.abort("rank " + std::to_string(rank) + " failed: " + describe_exception(error), error);
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(num_ranks);
  for (int rank = 1; rank < num_ranks; ++rank) threads.emplace_back(run_one, rank);
  // Rank 0 runs on the calling thread (R=1 starts no thread); the caller's
  // own compute budget is restored afterwards.
  const int caller_compute_threads = compute_threads();
  run_one(0);
  set_compute_threads(caller_compute_threads);
  for (auto& thread : threads) thread.join();
  if (!first_error) return;
  // The cause of the first abort is the root error by definition - also when
  // it was thrown inside a collective's algorithm whose handle was dropped
  // unwinding (its rank waited on another collective first), so that no
  // rank's own exception is it.
  if (const std::exception_ptr cause = world.abort_cause()) std::rethrow_exception(cause);
  std::rethrow_exception(first_root_error ? first_root_error : first_error);
}

}  // namespace epmoe::transport::threads
