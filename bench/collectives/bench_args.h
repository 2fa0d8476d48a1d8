// key=value arguments of bench_collectives and the timing loop shared by its
// parts (internal to bench/collectives/).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "measurement.h"
#include "transport/communicator.h"

namespace epmoe::bench {

struct BenchArgs {
  std::string part;  // links | overlap | mpi
  std::map<std::string, std::string> values;

  static BenchArgs parse(int argc, char** argv);  // throws ConfigError
  std::vector<int> ints(const std::string& key, const std::string& fallback) const;
  // "64K,1M,8M" -> bytes
  std::vector<std::int64_t> sizes(const std::string& key, const std::string& fallback) const;
  double number(const std::string& key, double fallback) const;
  TimingOptions timing() const;
  bool verify() const { return number("verify", 1) != 0; }
};

std::string format_bytes(std::int64_t bytes);  // 65536 -> "64 KiB"

// Times `run_once` (which does one collective and waits for it) on every rank
// of comm: a warm-up run, then a run count fixed from rank 0's warm-up time
// and broadcast, so every rank runs the same number of times; each run starts
// after a barrier. Returns rank 0's timing (all ranks return it).
Timing measure(transport::Communicator& comm, const TimingOptions& options, const std::function<void()>& run_once);

}  // namespace epmoe::bench
