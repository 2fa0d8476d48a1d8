// bench_fma_peak: the machine's f32 FMA peak (bench/fma_peak.h) on one
// thread and on all cores, the ceiling the GEMM benchmarks are judged by.
//
//   bench_fma_peak [--threads N] [--seconds S]
#include "fma_peak.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/threading.h"

int main(int argc, char** argv) {
  int threads = epmoe::hardware_cores();
  double seconds = 0.2;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc)
      seconds = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--seconds S]\n", argv[0]);
      return 2;
    }
  }
  if (threads < 1) {
    std::fprintf(stderr, "bench_fma_peak: --threads must be at least 1\n");
    return 2;
  }
  const epmoe::bench::FmaPeak one = epmoe::bench::measure_fma_peak(1, seconds);
  const epmoe::bench::FmaPeak all = epmoe::bench::measure_fma_peak(threads, seconds);
  std::printf(
      "f32 FMA peak (%d-lane FMA, 12 chains): 1 thread %.1f GFLOP/s, %d threads %.1f GFLOP/s "
      "(%.2f x one thread)\n",
      one.vector_floats, one.gflops, all.threads, all.gflops, all.gflops / one.gflops);
  return 0;
}
