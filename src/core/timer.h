// Timing of named phases (route, dispatch, expert compute, ...): wall-clock
// seconds, or modelled seconds when the calling thread runs on a modelled
// clock (core/modelled_clock.h).
#pragma once

#include <chrono>
#include <map>
#include <string>

namespace epmoe {

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double elapsed_seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// Accumulated seconds per phase name.
using PhaseTimes = std::map<std::string, double>;

// Seconds on the calling thread's clock: modelled when it has one, else
// steady wall time. Only differences mean anything.
double this_thread_clock_seconds();

// Adds the lifetime of the scope, on the calling thread's clock, to
// `times[phase]`, and records it as a "phase" event on the thread's trace
// track (core/trace_recorder.h) when it has one.
class ScopedPhase {
 public:
  ScopedPhase(PhaseTimes& times, std::string phase);
  ~ScopedPhase();
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseTimes& times_;
  std::string phase_;
  double start_seconds_;
  double trace_begin_us_;
};

}  // namespace epmoe
