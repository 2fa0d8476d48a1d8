// A small timing harness shared by the benchmarks (gloo benchmark/options.h,
// Highway nanobenchmark.h in spirit): warm-up calls, then repetitions that each
// run the callable enough times to last a minimum time, reported as the median
// and the spread over repetitions. A std::function call costs ~2 ns, nothing
// next to the millisecond kernels timed here.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace epmoe::bench {

struct BenchOptions {
  int warmup_calls = 2;                 // untimed: caches, page faults, primitive creation
  double min_repetition_seconds = 0.1;  // each repetition runs at least this long
  int repetitions = 5;
};

struct BenchStats {
  double median_seconds = 0;  // per call
  double min_seconds = 0;     // per call, fastest repetition
  double max_seconds = 0;     // per call, slowest repetition
  std::int64_t calls_per_repetition = 0;
  // (max - min) / median: how far apart the repetitions were.
  double relative_spread() const { return median_seconds > 0 ? (max_seconds - min_seconds) / median_seconds : 0; }
};

namespace detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline BenchStats summarize(std::vector<double> per_call, std::int64_t calls_per_repetition) {
  std::sort(per_call.begin(), per_call.end());
  const std::size_t mid = per_call.size() / 2;
  BenchStats stats;
  stats.median_seconds = per_call.size() % 2 ? per_call[mid] : (per_call[mid - 1] + per_call[mid]) / 2;
  stats.min_seconds = per_call.front();
  stats.max_seconds = per_call.back();
  stats.calls_per_repetition = calls_per_repetition;
  return stats;
}

}  // namespace detail

// Measures several callables with their repetitions interleaved (A B C A B C
// ...), so that a background load that comes and goes (this machine's 2 cores
// are shared) hits all of them alike and their ratios stay meaningful.
inline std::vector<BenchStats> measure_interleaved(const std::vector<std::function<void()>>& fns,
                                                   const BenchOptions& options = {}) {
  const std::size_t count = fns.size();
  std::vector<std::int64_t> calls(count);
  for (std::size_t f = 0; f < count; ++f) {
    for (int i = 0; i < options.warmup_calls; ++i) fns[f]();
    // Calibrate: one timed call decides how many calls fill a repetition.
    const auto probe_start = detail::Clock::now();
    fns[f]();
    const double probe_seconds = std::max(detail::seconds_since(probe_start), 1e-9);
    calls[f] = std::max<std::int64_t>(1, static_cast<std::int64_t>(options.min_repetition_seconds / probe_seconds));
  }
  const int repetitions = std::max(1, options.repetitions);
  std::vector<std::vector<double>> per_call(count, std::vector<double>(repetitions));
  for (int r = 0; r < repetitions; ++r) {
    for (std::size_t f = 0; f < count; ++f) {
      const auto start = detail::Clock::now();
      for (std::int64_t i = 0; i < calls[f]; ++i) fns[f]();
      per_call[f][r] = detail::seconds_since(start) / static_cast<double>(calls[f]);
    }
  }
  std::vector<BenchStats> stats;
  for (std::size_t f = 0; f < count; ++f) stats.push_back(detail::summarize(per_call[f], calls[f]));
  return stats;
}

inline BenchStats measure(const std::function<void()>& fn, const BenchOptions& options = {}) {
  return measure_interleaved({fn}, options).front();
}

// The 1, 5 and 15 minute load averages, printed beside every table: how
// busy the shared machine was while it was measured.
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace epmoe::bench
