// Wall-clock timing of named phases (route, dispatch, expert compute, ...).
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
class PhaseTimes {
 public:
  void add(const std::string& phase, double seconds) { seconds_[phase] += seconds; }
  const std::map<std::string, double>& seconds() const { return seconds_; }

 private:
  std::map<std::string, double> seconds_;
};

// Adds the lifetime of the scope to `times[phase]`.
class ScopedPhase {
 public:
  ScopedPhase(PhaseTimes& times, std::string phase) : times_(times), phase_(std::move(phase)) {}
  ~ScopedPhase() { times_.add(phase_, watch_.elapsed_seconds()); }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseTimes& times_;
  std::string phase_;
  Stopwatch watch_;
};

}  // namespace epmoe
