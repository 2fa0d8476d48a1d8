// Repeated timing for bench_collectives (gloo benchmark/options.h style):
// one warm-up run, then max(min_runs, min_seconds / warm-up time) runs, at
// most max_runs; median and spread reported. Unlike bench/bench_harness.h
// (one process, its own clock) every rank must make the same number of runs,
// each started by a barrier, so the run count is rank 0's, broadcast.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

namespace epmoe::bench {

struct TimingOptions {
  int min_runs = 5;
  int max_runs = 50;
  double min_seconds = 0.2;
};

struct Timing {
  double median_s = 0;
  double min_s = 0;
  double max_s = 0;
  int runs = 0;
};

// Median and spread of per-run seconds (bench_args.h measure() collects them).
inline Timing summarise(std::vector<double> seconds) {
  Timing timing;
  if (seconds.empty()) return timing;
  std::sort(seconds.begin(), seconds.end());
  timing.runs = static_cast<int>(seconds.size());
  timing.median_s = seconds[seconds.size() / 2];
  timing.min_s = seconds.front();
  timing.max_s = seconds.back();
  return timing;
}

}  // namespace epmoe::bench
