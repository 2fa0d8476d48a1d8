#include "transport/threads/rank_run.h"

#include <string>

#include "core/modelled_clock.h"
#include "core/threading.h"

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

// The rank's clock and trace track while it runs; a rank that has returned
// (or thrown) holds back nobody's virtual time.
class RankThreadScope {
 public:
  RankThreadScope(VirtualTimeline* timeline, int rank, TraceRecorder* trace)
      : timeline_(timeline),
        rank_(rank),
        previous_clock_(set_this_thread_modelled_clock(timeline != nullptr ? &timeline->rank_clock(rank) : nullptr)),
        previous_track_(set_this_thread_trace_track({trace, rank})) {}
  ~RankThreadScope() {
    if (timeline_ != nullptr) timeline_->finish_rank(rank_);
    set_this_thread_modelled_clock(previous_clock_);
    set_this_thread_trace_track(previous_track_);
  }
  RankThreadScope(const RankThreadScope&) = delete;
  RankThreadScope& operator=(const RankThreadScope&) = delete;

 private:
  VirtualTimeline* timeline_;
  int rank_;
  ModelledClock* previous_clock_;
  TraceTrack previous_track_;
};

}  // namespace

void RankRun::run_rank(int rank, const std::function<void(Communicator&)>& fn) noexcept {
  RankThreadScope scope(world_.timeline(), rank, trace_);
  try {
    set_compute_threads(compute_threads_per_rank_);
    fn(world_.communicator(rank));
    // A modelled time past the clock's range in the job's last compute has
    // nobody left to throw it (core/modelled_clock.h): this rank does.
    if (const VirtualTimeline* timeline = world_.timeline()) timeline->throw_if_overflowed();
  } catch (const AbortedError& e) {
    {
      std::lock_guard<std::mutex> lock(first_error_mutex_);
      if (!first_error_) first_error_ = std::current_exception();
    }
    // Usually a no-op (the group is aborted already, first reason wins); it
    // matters only if this rank's waits were cancelled and no abort followed.
    world_.abort("rank " + std::to_string(rank) + " failed: " + e.what());
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    {
      std::lock_guard<std::mutex> lock(first_error_mutex_);
      if (!first_error_) first_error_ = error;
      if (!first_root_error_) first_root_error_ = error;
    }
    world_.abort("rank " + std::to_string(rank) + " failed: " + describe_exception(error), error);
  }
}

void RankRun::rethrow_root_error() const {
  std::lock_guard<std::mutex> lock(first_error_mutex_);
  if (!first_error_) return;
  // The cause of the first abort is the root error by definition - also when
  // it was thrown inside a collective's algorithm whose handle was dropped
  // unwinding (its rank waited on another collective first), so that no
  // rank's own exception is it.
  if (const std::exception_ptr cause = world_.abort_cause()) std::rethrow_exception(cause);
  std::rethrow_exception(first_root_error_ ? first_root_error_ : first_error_);
}

}  // namespace epmoe::transport::threads
