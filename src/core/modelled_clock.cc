#include "core/modelled_clock.h"

#include <time.h>

#include <cmath>

#include "core/error.h"
#include "core/trace_recorder.h"

namespace epmoe {
namespace {

thread_local ModelledClock* this_thread_clock = nullptr;
thread_local int open_compute_scopes = 0;  // a scope inside another is part of it: charged once

}  // namespace

Picoseconds seconds_to_picoseconds(double seconds) {
  EPMOE_CHECK(std::isfinite(seconds) && seconds >= 0);
  return static_cast<Picoseconds>(std::llround(seconds * static_cast<double>(kPicosecondsPerSecond)));
}

ModelledClock* this_thread_modelled_clock() { return this_thread_clock; }

ModelledClock* set_this_thread_modelled_clock(ModelledClock* clock) {
  ModelledClock* previous = this_thread_clock;
  this_thread_clock = clock;
  return previous;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

ComputeScope::ComputeScope(const char* name, const ComputeWork& work)
    : name_(name),
      work_(work),
      clock_(open_compute_scopes == 0 ? this_thread_modelled_clock() : nullptr),
      traced_(this_thread_trace_track().recorder != nullptr) {
  ++open_compute_scopes;
  if (clock_ != nullptr && clock_->measures_compute()) cpu_start_ = thread_cpu_seconds();
  if (traced_) trace_start_us_ = this_thread_trace_now_us();
}

ComputeScope::~ComputeScope() {
  --open_compute_scopes;
  if (clock_ != nullptr) {
    const double cpu = clock_->measures_compute() ? thread_cpu_seconds() - cpu_start_ : 0.0;
    clock_->charge_compute(work_, cpu);
  }
  if (traced_) {
    const TraceTrack track = this_thread_trace_track();
    if (track.recorder != nullptr) {
      track.recorder->add_compute(track.pid, name_, "compute", trace_start_us_, this_thread_trace_now_us(),
                                  {{"flops", work_.flops}, {"bytes", work_.bytes}});
    }
  }
}

}  // namespace epmoe
