// Google Benchmark micro-benchmarks of the narrow-float conversions
// (kernels/convert.h) on one thread: they sit on the fp8 token transfer path
// and in front of every bf16 GEMM, so their bytes/s bound those paths.
//   bench_convert_micro [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <vector>

#include "core/rng.h"
#include "core/threading.h"
#include "kernels/convert.h"

namespace epmoe {
namespace {

constexpr std::int64_t kElements = 1 << 20;  // 4 MiB of floats: L2-resident-ish, no page faults

std::vector<float> random_floats() {
  Rng rng(1);
  std::vector<float> values(kElements);
  for (float& v : values) v = rng.uniform(-500.0f, 500.0f);
  return values;
}

template <typename Narrow>
void bm_float_to_narrow(benchmark::State& state) {
  set_compute_threads(1);
  const auto src = random_floats();
  std::vector<Narrow> dst(kElements);
  for (auto _ : state) {
    convert(src, dst);
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * kElements * sizeof(float));
}

template <typename Narrow>
void bm_narrow_to_float(benchmark::State& state) {
  set_compute_threads(1);
  const auto values = random_floats();
  std::vector<Narrow> src(kElements);
  convert(values, src);
  std::vector<float> dst(kElements);
  for (auto _ : state) {
    convert(src, dst);
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * kElements * sizeof(float));
}

BENCHMARK(bm_float_to_narrow<bf16_t>)->Name("float_to_bf16");
BENCHMARK(bm_narrow_to_float<bf16_t>)->Name("bf16_to_float");
BENCHMARK(bm_float_to_narrow<fp8_e4m3_t>)->Name("float_to_fp8_e4m3");
BENCHMARK(bm_narrow_to_float<fp8_e4m3_t>)->Name("fp8_e4m3_to_float");

}  // namespace
}  // namespace epmoe

BENCHMARK_MAIN();
