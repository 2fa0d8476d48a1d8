#include "core/timer.h"

#include "core/modelled_clock.h"
#include "core/trace_recorder.h"

namespace epmoe {

double this_thread_clock_seconds() {
  if (const ModelledClock* clock = this_thread_modelled_clock()) return to_seconds(clock->now());
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ScopedPhase::ScopedPhase(PhaseTimes& times, std::string phase)
    : times_(times),
      phase_(std::move(phase)),
      start_seconds_(this_thread_clock_seconds()),
      trace_begin_us_(this_thread_trace_now_us()) {}

ScopedPhase::~ScopedPhase() {
  times_[phase_] += this_thread_clock_seconds() - start_seconds_;
  const TraceTrack track = this_thread_trace_track();
  if (track.recorder != nullptr) {
    track.recorder->add_compute(track.pid, phase_, "phase", trace_begin_us_, this_thread_trace_now_us());
  }
}

}  // namespace epmoe
