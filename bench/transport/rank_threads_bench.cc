// The overhead of one whole-world call on R ranks as threads: an empty job
// (and a 4-byte ring exchange) run on every rank through RankThreads (threads
// started once, transport/threads/rank_threads.h) against run_ranks (a new
// world and R - 1 new threads per call, threads/launcher.h), interleaved in
// one run so that the shared machine's load hits both alike. Reports median
// and spread per call and the ratio run_ranks / RankThreads. Verification:
// every job counts its runs, and the counts must equal the calls made; the
// ring job checks the value it received.
// Usage: bench_rank_threads [R ...]     (default: 1 2 4 8)
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_harness.h"
#include "core/threading.h"
#include "transport/threads/launcher.h"
#include "transport/threads/rank_threads.h"

namespace {

using epmoe::transport::Communicator;
using namespace std::chrono_literals;

struct Counted {
  std::atomic<std::int64_t> jobs{0};
  std::int64_t calls = 0;  // whole-world calls made
};

void ring_exchange(Communicator& comm) {
  const int right = (comm.rank() + 1) % comm.size();
  const int left = (comm.rank() + comm.size() - 1) % comm.size();
  int sent = comm.rank(), received = -1;
  auto recv = comm.irecv(left, 1, &received, sizeof(received));
  auto send = comm.isend(right, 1, &sent, sizeof(sent));
  send->wait(10s);
  recv->wait(10s);
  if (received != left) {
    std::fprintf(stderr, "FAIL: rank %d received %d from rank %d\n", comm.rank(), received, left);
    std::exit(1);
  }
}

bool verify(const char* what, int num_ranks, const Counted& counted) {
  const std::int64_t expected = counted.calls * num_ranks;
  if (counted.jobs.load() == expected) return true;
  std::fprintf(stderr, "FAIL: %s R=%d: %lld jobs ran for %lld calls\n", what, num_ranks,
               static_cast<long long>(counted.jobs.load()), static_cast<long long>(counted.calls));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> rank_counts;
  for (int i = 1; i < argc; ++i) rank_counts.push_back(std::atoi(argv[i]));
  if (rank_counts.empty()) rank_counts = {1, 2, 4, 8};
  epmoe::transport::threads::ThreadsOptions options;
  options.compute_threads_per_rank = 1;
  epmoe::bench::BenchOptions bench_options;
  bench_options.repetitions = 7;
  std::printf("whole-world call overhead, %d hardware threads; per call: median [min, max] over %d repetitions\n",
              epmoe::hardware_cores(), bench_options.repetitions);
  std::printf("%4s %-6s %26s %26s %8s\n", "R", "job", "RankThreads us", "run_ranks us", "ratio");
  bool ok = true;
  for (const int num_ranks : rank_counts) {
    epmoe::transport::threads::RankThreads pool(num_ranks, options);
    for (const bool exchange : {false, true}) {
      Counted pooled, started;
      auto job = [&](Counted& counted) {
        return [&counted, exchange](Communicator& comm) {
          if (exchange) ring_exchange(comm);
          counted.jobs.fetch_add(1, std::memory_order_relaxed);
        };
      };
      const auto pooled_job = job(pooled), started_job = job(started);
      const std::vector<epmoe::bench::BenchStats> stats =
          epmoe::bench::measure_interleaved({[&] {
                                               pool.run(pooled_job);
                                               ++pooled.calls;
                                             },
                                             [&] {
                                               epmoe::transport::threads::run_ranks(num_ranks, options, started_job);
                                               ++started.calls;
                                             }},
                                            bench_options);
      ok = verify("RankThreads", num_ranks, pooled) && verify("run_ranks", num_ranks, started) && ok;
      auto cell = [](const epmoe::bench::BenchStats& s) {
        char text[64];
        std::snprintf(text, sizeof(text), "%.1f [%.1f, %.1f]", s.median_seconds * 1e6, s.min_seconds * 1e6,
                      s.max_seconds * 1e6);
        return std::string(text);
      };
      std::printf("%4d %-6s %26s %26s %7.1fx\n", num_ranks, exchange ? "ring" : "empty", cell(stats[0]).c_str(),
                  cell(stats[1]).c_str(), stats[1].median_seconds / stats[0].median_seconds);
    }
  }
  return ok ? 0 : 1;
}
