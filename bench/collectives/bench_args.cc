#include "bench_args.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "comm/barrier.h"
#include "comm/broadcast.h"
#include "core/error.h"

namespace epmoe::bench {
namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

}  // namespace

BenchArgs BenchArgs::parse(int argc, char** argv) {
  BenchArgs args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto equals = arg.find('=');
    if (equals == std::string::npos) {
      if (!args.part.empty()) throw ConfigError("bench collectives: two parts given: " + args.part + ", " + arg);
      args.part = arg;
    } else {
      args.values[arg.substr(0, equals)] = arg.substr(equals + 1);
    }
  }
  if (args.part.empty()) args.part = std::getenv("OMPI_COMM_WORLD_SIZE") ? "mpi" : "links";
  return args;
}

std::vector<int> BenchArgs::ints(const std::string& key, const std::string& fallback) const {
  const auto it = values.find(key);
  std::vector<int> out;
  for (const auto& item : split(it == values.end() ? fallback : it->second)) out.push_back(std::stoi(item));
  return out;
}

std::vector<std::int64_t> BenchArgs::sizes(const std::string& key, const std::string& fallback) const {
  const auto it = values.find(key);
  std::vector<std::int64_t> out;
  for (const auto& item : split(it == values.end() ? fallback : it->second)) {
    std::int64_t scale = 1;
    std::string digits = item;
    if (item.back() == 'K') scale = 1024;
    if (item.back() == 'M') scale = 1024 * 1024;
    if (scale != 1) digits.pop_back();
    const std::int64_t bytes = std::stoll(digits) * scale;
    if (bytes <= 0) throw ConfigError("bench collectives: " + key + " item " + item + ": must be > 0");
    out.push_back(bytes);
  }
  return out;
}

double BenchArgs::number(const std::string& key, double fallback) const {
  const auto it = values.find(key);
  return it == values.end() ? fallback : std::stod(it->second);
}

TimingOptions BenchArgs::timing() const {
  TimingOptions options;
  options.min_runs = static_cast<int>(number("min_runs", options.min_runs));
  options.max_runs = static_cast<int>(number("max_runs", options.max_runs));
  options.min_seconds = number("min_seconds", options.min_seconds);
  return options;
}

std::string format_bytes(std::int64_t bytes) {
  if (bytes % (1024 * 1024) == 0) return std::to_string(bytes / (1024 * 1024)) + " MiB";
  if (bytes % 1024 == 0) return std::to_string(bytes / 1024) + " KiB";
  return std::to_string(bytes) + " B";
}

Timing measure(transport::Communicator& comm, const TimingOptions& options, const std::function<void()>& run_once) {
  auto timed_run = [&] {
    comm::barrier(comm, comm::BarrierOptions{.tag = 90}).wait();
    const auto start = std::chrono::steady_clock::now();
    run_once();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const double warm_up = timed_run();
  // Rank 0 decides the run count; everyone runs it.
  std::int64_t runs =
      std::max<std::int64_t>(options.min_runs, static_cast<std::int64_t>(std::ceil(options.min_seconds / warm_up)));
  runs = std::min<std::int64_t>(runs, options.max_runs);
  comm::BroadcastOptions broadcast;
  broadcast.data = &runs;
  broadcast.num_elements = 1;
  broadcast.dtype = DType::i64;
  broadcast.tag = 91;
  comm::broadcast(comm, broadcast).wait();
  std::vector<double> seconds;
  for (std::int64_t i = 0; i < runs; ++i) seconds.push_back(timed_run());
  Timing timing = summarise(seconds);
  // Rank 0's numbers for everyone, so that any rank may print.
  double summary[3] = {timing.median_s, timing.min_s, timing.max_s};
  comm::BroadcastOptions share;
  share.data = summary;
  share.num_elements = 3;
  share.dtype = DType::i64;  // 8-byte elements: moved as bytes
  share.tag = 92;
  comm::broadcast(comm, share).wait();
  timing.median_s = summary[0];
  timing.min_s = summary[1];
  timing.max_s = summary[2];
  return timing;
}

}  // namespace epmoe::bench
