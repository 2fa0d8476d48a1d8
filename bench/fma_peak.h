// The machine's f32 FMA peak, measured: a tight loop of independent vector
// FMAs on every compute thread, the ceiling no GEMM can pass. Benchmarks
// print their GFLOP/s as a fraction of it, measured in the same run (the
// machine kind and its background load vary between sessions, DESIGN.md §7).
//
// Widest FMA this build targets: AVX-512 when compiled for it (-march=native
// on an AVX-512 machine), else AVX2 FMA. 12 independent accumulators per
// thread: an FMA unit needs latency x throughput (4-5 cycles x 2 per cycle
// on Zen and Intel cores) chains in flight, and 12 fit in the 16 ymm
// registers AVX2 has, leaving room for the two operands.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace epmoe::bench {

struct FmaPeak {
  double gflops = 0;  // f32 FLOP/s (an FMA counts 2) over all threads, best repetition
  int threads = 0;
  int vector_floats = 0;  // f32 lanes per FMA: 8 (AVX2) or 16 (AVX-512)
};

namespace detail {

#if defined(__AVX512F__)
using FmaVector = __m512;
constexpr int kFmaLanes = 16;
inline FmaVector fma_set1(float v) { return _mm512_set1_ps(v); }
inline FmaVector fma_op(FmaVector a, FmaVector b, FmaVector c) { return _mm512_fmadd_ps(a, b, c); }
inline float fma_sum(FmaVector v) { return _mm512_reduce_add_ps(v); }
#elif defined(__FMA__)
using FmaVector = __m256;
constexpr int kFmaLanes = 8;
inline FmaVector fma_set1(float v) { return _mm256_set1_ps(v); }
inline FmaVector fma_op(FmaVector a, FmaVector b, FmaVector c) { return _mm256_fmadd_ps(a, b, c); }
inline float fma_sum(FmaVector v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  float s = 0;
  for (float x : lanes) s += x;
  return s;
}
#else
#error "bench/fma_peak.h needs a build with FMA (x86-64-v3 or newer)"
#endif

constexpr int kFmaChains = 12;

// iterations x kFmaChains FMAs; acc = acc * m + c stays bounded (m < 1), so
// no denormals or infinities slow the loop down.
inline float fma_loop(std::int64_t iterations, float seed) {
  FmaVector acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = fma_set1(seed + 0.01f * i);
  const FmaVector m = fma_set1(0.999f), c = fma_set1(0.001f);
  for (std::int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kFmaChains; ++i) acc[i] = fma_op(acc[i], m, c);
  }
  float s = 0;
  for (int i = 0; i < kFmaChains; ++i) s += fma_sum(acc[i]);
  return s;
}

}  // namespace detail

// Runs the loop on `threads` OpenMP threads at once for about `seconds` per
// repetition; the best of `repetitions` (a peak: background load only lowers it).
inline FmaPeak measure_fma_peak(int threads, double seconds = 0.2, int repetitions = 5) {
  using Clock = std::chrono::steady_clock;
  // Calibrate the iteration count on one thread.
  std::int64_t iterations = 1 << 16;
  volatile float sink = 0;
  for (;;) {
    const auto start = Clock::now();
    sink = sink + detail::fma_loop(iterations, 1.0f);
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (elapsed > seconds / 4 || iterations > (std::int64_t{1} << 40)) {
      iterations = static_cast<std::int64_t>(iterations * (seconds / std::max(elapsed, 1e-9)));
      break;
    }
    iterations *= 4;
  }
  double best = 0;
  for (int rep = 0; rep < repetitions; ++rep) {
    std::vector<float> results(threads);
    const auto start = Clock::now();
#pragma omp parallel num_threads(threads)
    results[omp_get_thread_num()] = detail::fma_loop(iterations, 1.0f + omp_get_thread_num());
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    for (float r : results) sink = sink + r;
    const double flops = 2.0 * detail::kFmaLanes * detail::kFmaChains * double(iterations) * threads;
    best = std::max(best, flops / elapsed * 1e-9);
  }
  return {best, threads, detail::kFmaLanes};
}

}  // namespace epmoe::bench
