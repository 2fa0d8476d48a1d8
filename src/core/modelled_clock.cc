#include "core/modelled_clock.h"

#include <time.h>

#include <cmath>
#include <iomanip>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "core/trace_recorder.h"

namespace epmoe {
namespace {

thread_local ModelledClock* this_thread_clock = nullptr;
thread_local bool this_thread_off = false;  // OffTimelineScope
thread_local int open_compute_scopes = 0;   // a scope inside another is part of it: charged once

std::string seconds_text(double seconds) {
  std::ostringstream text;
  text << std::setprecision(3) << seconds << " s";
  return text.str();
}

std::string beyond_the_clock(std::string_view what, const std::string& value) {
  std::ostringstream msg;
  msg << "clock=modelled: " << what << " is " << value << ", beyond the modelled clock's range (at most "
      << std::setprecision(3) << kMaxModelledSeconds << " s, ~106 days, in int64 picoseconds)";
  return msg.str();
}

}  // namespace

Picoseconds seconds_to_picoseconds(double seconds, std::string_view what) {
  EPMOE_CHECK(!std::isnan(seconds) && seconds >= 0, what, " = ", seconds, " s");
  const double picoseconds = std::round(seconds * static_cast<double>(kPicosecondsPerSecond));  // as llround
  // 2^63 is the first double past INT64_MAX (the ones below it convert exactly).
  if (!(picoseconds < 0x1p63)) throw ConfigError(beyond_the_clock(what, seconds_text(seconds)));
  return static_cast<Picoseconds>(picoseconds);
}

Picoseconds add_picoseconds(Picoseconds a, Picoseconds b, std::string_view what) {
  Picoseconds sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    throw ConfigError(beyond_the_clock(what, seconds_text(to_seconds(a)) + " + " + seconds_text(to_seconds(b))));
  }
  return sum;
}

ModelledClock* this_thread_modelled_clock() { return this_thread_clock; }

ModelledClock* set_this_thread_modelled_clock(ModelledClock* clock) {
  ModelledClock* previous = this_thread_clock;
  this_thread_clock = clock;
  return previous;
}

bool this_thread_off_timeline() { return this_thread_off; }

bool set_this_thread_off_timeline(bool off) { return std::exchange(this_thread_off, off); }

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
    clock_->charge_compute(work_, cpu, name_);
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
