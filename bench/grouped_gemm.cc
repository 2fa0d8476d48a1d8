// bench_grouped_gemm: grouped GEMM (forward, dlhs, drhs) on MoE-shaped ragged
// groups against one dense matmul of the same total FLOPs, measured in the
// same run (DESIGN.md §4.3), and against the naive schedule (every group on
// all threads in turn) to show what the balanced schedule buys, and against
// row blocks (issue 29: the (group, row block) task space with weights packed
// per version, kernels/grouped_gemm.h RowBlocking; forced on, since on AVX2
// automatic never picks it; drhs has none, its column compares like with
// like). Every grouped product gets a weight version and weights in a
// Tensor, as the layer's do, so that kernels/gemm.cc's per-version forms
// (the f32 copies off the 32-byte grid) apply as in the layer.
// Verification is on by default: sampled output elements of both
// paths are recomputed in double and held to the tests' error bounds.
//
//   bench_grouped_gemm [--quick] [--no-verify] [--fresh-sizes] [--threads N] [--rows M]
//
// --rows M runs M rows only (4096: the single-rank layer's N K = 2048 x 2).
// --fresh-sizes redraws the Zipf group sizes before every call (a new routing
// every step, as in training), so that shape-keyed caches see new shapes.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "bench_harness.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "core/threading.h"
#include "fma_peak.h"
#include "kernels/gemm.h"
#include "kernels/grouped_gemm.h"

namespace epmoe {
namespace {

struct Options {
  bool quick = false;
  bool verify = true;
  bool fresh_sizes = false;
  int threads = 0;        // 0: all cores
  std::int64_t rows = 0;  // 0: the default row counts
};

constexpr double kZipfExponent = 1.2;
constexpr std::int64_t kHidden = 1024;  // forward k (H)
constexpr std::int64_t kFfn = 512;      // forward n (F)

enum class Op { forward, dlhs, drhs };
const char* op_name(Op op) { return op == Op::forward ? "fwd" : op == Op::dlhs ? "dlhs" : "drhs"; }

std::vector<std::int64_t> uniform_sizes(std::int64_t rows, int num_groups) {
  std::vector<std::int64_t> sizes(num_groups, rows / num_groups);
  for (std::int64_t g = 0; g < rows % num_groups; ++g) ++sizes[g];
  return sizes;
}

// Each row picks group g with probability ∝ (g + 1)^-s (inverse CDF).
std::vector<std::int64_t> zipf_sizes(std::int64_t rows, int num_groups, Rng& rng) {
  std::vector<double> cdf(num_groups);
  double total = 0;
  for (int g = 0; g < num_groups; ++g) cdf[g] = total += std::pow(g + 1.0, -kZipfExponent);
  std::vector<std::int64_t> sizes(num_groups, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const double u = rng.uniform01() * total;
    const auto g = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
    ++sizes[std::min<std::ptrdiff_t>(g, num_groups - 1)];
  }
  return sizes;
}

// The weights live in a Tensor, as the layer's do: its buffers are 64-byte
// aligned (2 MiB from 2 MiB up), so every group's matrix starts on the
// 32-byte grid whose effect on oneDNN's forward kernels/gemm.cc handles
// (a std::vector's large buffer starts 16 bytes past a page: off the grid).
struct Buffers {
  std::vector<float> x;
  Tensor w;
  std::vector<float> out, dout, dx, dw;
};

Buffers make_buffers(std::int64_t rows, int num_groups) {
  Rng rng(1);
  auto random = [&](std::int64_t n) {
    std::vector<float> v(n);
    for (float& f : v) f = rng.uniform(-1.0f, 1.0f);
    return v;
  };
  std::vector<float> x = random(rows * kHidden);
  Tensor w(DType::f32, {num_groups, kHidden, kFfn});
  for (float& v : w.span<float>()) v = rng.uniform(-1.0f, 1.0f);
  return {std::move(x),
          std::move(w),
          std::vector<float>(rows * kFfn),
          random(rows * kFfn),
          std::vector<float>(rows * kHidden),
          std::vector<float>(num_groups * kHidden * kFfn)};
}

void run_grouped(Op op, const GroupedGemmShape& shape, Buffers& buf) {
  switch (op) {
    case Op::forward:
      grouped_gemm_forward(shape, buf.x.data(), buf.w.data<float>(), buf.out.data());
      break;
    case Op::dlhs:
      grouped_gemm_dlhs(shape, buf.dout.data(), buf.w.data<float>(), buf.dx.data());
      break;
    case Op::drhs:
      grouped_gemm_drhs(shape, buf.x.data(), buf.dout.data(), buf.dw.data());
      break;
  }
}

// The same product as one matmul over all rows (one weight matrix).
void run_dense(Op op, std::int64_t rows, ComputeDType dtype, Buffers& buf) {
  switch (op) {
    case Op::forward:
      // With the grouped products' weight version: the same per-version
      // forms (the f32 copy off the 32-byte grid, kernels/gemm.h), so the
      // peer runs on the placement the grouped forward gets.
      gemm({.a = buf.x.data(),
            .b = buf.w.data<float>(),
            .c = buf.out.data(),
            .m = rows,
            .n = kFfn,
            .k = kHidden,
            .compute_dtype = dtype,
            .b_version = 1});
      break;
    case Op::dlhs:
      gemm({.a = buf.dout.data(),
            .b = buf.w.data<float>(),
            .c = buf.dx.data(),
            .m = rows,
            .n = kHidden,
            .k = kFfn,
            .transpose_b = true,
            .compute_dtype = dtype});
      break;
    case Op::drhs:
      gemm({.a = buf.x.data(),
            .b = buf.dout.data(),
            .c = buf.dw.data(),
            .m = kHidden,
            .n = kFfn,
            .k = rows,
            .transpose_a = true,
            .compute_dtype = dtype});
      break;
  }
}

// Recomputes 64 sampled output elements in double; the error must stay below
// tol * sum|terms|, with tol the bound derived in tests/kernels/gemm_test.cc.
bool verify(Op op, const std::vector<std::int64_t>& sizes, ComputeDType dtype, const Buffers& buf) {
  const int num_groups = static_cast<int>(sizes.size());
  std::vector<std::int64_t> offsets(num_groups + 1, 0);
  std::partial_sum(sizes.begin(), sizes.end(), offsets.begin() + 1);
  const std::int64_t rows = offsets.back();
  auto group_of = [&](std::int64_t row) {
    return static_cast<int>(std::upper_bound(offsets.begin(), offsets.end(), row) - offsets.begin() - 1);
  };
  const std::int64_t inner = op == Op::forward ? kHidden : op == Op::dlhs ? kFfn : rows;
  const double tol = (dtype == ComputeDType::bf16 ? 2 * 0x1p-8 + 0x1p-16 : 0.0) + 2 * inner * 0x1p-24;
  Rng rng(99);
  for (int sample = 0; sample < 64; ++sample) {
    double sum = 0, abs_sum = 0, got = 0;
    if (op == Op::forward || op == Op::dlhs) {
      if (rows == 0) return true;
      const std::int64_t r = rng.uniform_int(rows);
      const float* w_g = buf.w.data<float>() + group_of(r) * kHidden * kFfn;
      if (op == Op::forward) {
        const std::int64_t j = rng.uniform_int(kFfn);
        for (std::int64_t p = 0; p < kHidden; ++p) {
          const double t = double(buf.x[r * kHidden + p]) * w_g[p * kFfn + j];
          sum += t, abs_sum += std::abs(t);
        }
        got = buf.out[r * kFfn + j];
      } else {
        const std::int64_t p = rng.uniform_int(kHidden);
        for (std::int64_t j = 0; j < kFfn; ++j) {
          const double t = double(buf.dout[r * kFfn + j]) * w_g[p * kFfn + j];
          sum += t, abs_sum += std::abs(t);
        }
        got = buf.dx[r * kHidden + p];
      }
    } else {
      const int g = static_cast<int>(rng.uniform_int(num_groups));
      const std::int64_t p = rng.uniform_int(kHidden), j = rng.uniform_int(kFfn);
      for (std::int64_t r = offsets[g]; r < offsets[g + 1]; ++r) {
        const double t = double(buf.x[r * kHidden + p]) * buf.dout[r * kFfn + j];
        sum += t, abs_sum += std::abs(t);
      }
      got = buf.dw[(g * kHidden + p) * kFfn + j];
    }
    if (std::abs(got - sum) > tol * abs_sum + 1e-30 || std::isnan(got)) {
      std::fprintf(stderr, "verification failed (%s, %s): got %.9g, expected %.9g\n", op_name(op),
                   to_string(dtype).c_str(), got, sum);
      return false;
    }
  }
  return true;
}

double gflops(double flops, const bench::BenchStats& stats) { return flops / stats.median_seconds * 1e-9; }

int run(const Options& options) {
  set_compute_threads(options.threads > 0 ? options.threads : hardware_cores());
  const bench::BenchOptions timing{
      .warmup_calls = 2, .min_repetition_seconds = options.quick ? 0.05 : 0.1, .repetitions = options.quick ? 3 : 5};
  const std::vector<std::int64_t> row_counts = options.rows > 0 ? std::vector<std::int64_t>{options.rows}
                                               : options.quick  ? std::vector<std::int64_t>{8192}
                                                                : std::vector<std::int64_t>{8192, 16384};
  const std::vector<int> group_counts = options.quick ? std::vector<int>{8, 64} : std::vector<int>{8, 16, 64};
  std::printf("bench_grouped_gemm: H(k)=%lld F(n)=%lld, %d compute threads, Zipf exponent %.1f%s\n",
              static_cast<long long>(kHidden), static_cast<long long>(kFfn), compute_threads(), kZipfExponent,
              options.fresh_sizes ? ", Zipf sizes redrawn every call" : "");

  {  // Machine context: the FMA ceiling and one big square matmul.
    const bench::FmaPeak peak = bench::measure_fma_peak(compute_threads());
    std::printf("peak context: f32 FMA loop %.1f GFLOP/s (%d-lane FMA, %d threads)\n", peak.gflops, peak.vector_floats,
                peak.threads);
    const std::int64_t s = 2048;
    std::vector<float> a(s * s, 0.5f), b(s * s, 0.25f), c(s * s);
    for (ComputeDType dtype : {ComputeDType::f32, ComputeDType::bf16}) {
      if (dtype == ComputeDType::bf16 && !bf16_gemm_supported()) continue;
      const auto stats = bench::measure(
          [&] { gemm({.a = a.data(), .b = b.data(), .c = c.data(), .m = s, .n = s, .k = s, .compute_dtype = dtype}); },
          timing);
      std::printf("peak context: %lldx%lldx%lld %s matmul %.1f GFLOP/s (spread %.1f%%)\n", static_cast<long long>(s),
                  static_cast<long long>(s), static_cast<long long>(s), to_string(dtype).c_str(),
                  gflops(2.0 * s * s * s, stats), 100 * stats.relative_spread());
      std::printf("peak context: that matmul is %.2f of the FMA peak\n", gflops(2.0 * s * s * s, stats) / peak.gflops);
    }
  }

  std::printf(
      "\n| rows | E | sizes | dtype | op | grouped ms (spread) | grouped GFLOP/s "
      "| one-group-at-a-time GFLOP/s | dense GFLOP/s | grouped/dense | row blocks / grouped speed |\n");
  std::printf("|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|\n");
  bool all_ok = true;
  for (std::int64_t rows : row_counts) {
    const int max_groups = *std::max_element(group_counts.begin(), group_counts.end());
    Buffers buf = make_buffers(rows, max_groups);
    const double flops = 2.0 * rows * kHidden * kFfn;
    for (ComputeDType dtype : {ComputeDType::f32, ComputeDType::bf16}) {
      if (dtype == ComputeDType::bf16 && !bf16_gemm_supported()) {
        std::printf("| %lld | | | bf16 | | skipped: oneDNN has no bf16 matmul on this CPU | | | | | |\n",
                    static_cast<long long>(rows));
        continue;
      }
      for (Op op : {Op::forward, Op::dlhs, Op::drhs}) {
        for (int num_groups : group_counts) {
          for (bool zipf : {false, true}) {
            Rng rng(static_cast<std::uint64_t>(rows * 1000 + num_groups));
            std::vector<std::int64_t> sizes =
                zipf ? zipf_sizes(rows, num_groups, rng) : uniform_sizes(rows, num_groups);
            // Per-group path (the two schedules) and row blocks (the task
            // space of kernels/grouped_gemm.h with packed weights per version;
            // forced here, where automatic picks it only if oneDNN packs).
            auto grouped_with = [&](GroupSchedule schedule, RowBlocking blocking) {
              return [&, schedule, blocking] {
                if (zipf && options.fresh_sizes) sizes = zipf_sizes(rows, num_groups, rng);
                run_grouped(op,
                            {.group_sizes = sizes,
                             .k = kHidden,
                             .n = kFfn,
                             .compute_dtype = dtype,
                             .schedule = schedule,
                             .weight_version = 1,  // as the layer gives its grouped products
                             .row_blocking = blocking},
                            buf);
              };
            };
            // The dense peer is re-measured beside every configuration,
            // interleaved with it, so that both see the same background load.
            const auto measured =
                bench::measure_interleaved({[&] { run_dense(op, rows, dtype, buf); },
                                            grouped_with(GroupSchedule::one_group_at_a_time, RowBlocking::never),
                                            grouped_with(GroupSchedule::balanced, RowBlocking::always),
                                            grouped_with(GroupSchedule::balanced, RowBlocking::never)},
                                           timing);
            const auto& dense = measured[0];
            const auto& naive = measured[1];
            const auto& blocks = measured[2];
            const auto& stats = measured[3];
            if (options.verify && !verify(op, sizes, dtype, buf)) all_ok = false;
            if (options.verify && op != Op::drhs) {  // drhs has no row blocks
              grouped_with(GroupSchedule::balanced, RowBlocking::always)();
              if (!verify(op, sizes, dtype, buf)) all_ok = false;
            }
            const auto [min_it, max_it] = std::minmax_element(sizes.begin(), sizes.end());
            std::printf("| %lld | %d | %s %lld..%lld | %s | %s | %.2f (%.0f%%) | %.0f | %.0f | %.0f | %.2f | %.2f |\n",
                        static_cast<long long>(rows), num_groups, zipf ? "zipf" : "uniform",
                        static_cast<long long>(*min_it), static_cast<long long>(*max_it), to_string(dtype).c_str(),
                        op_name(op), stats.median_seconds * 1e3, 100 * stats.relative_spread(), gflops(flops, stats),
                        gflops(flops, naive), gflops(flops, dense), dense.median_seconds / stats.median_seconds,
                        stats.median_seconds / blocks.median_seconds);
            std::fflush(stdout);
          }
        }
      }
    }
  }
  std::printf("\nverification: %s\n", !options.verify ? "off" : all_ok ? "passed" : "FAILED");
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace epmoe

int main(int argc, char** argv) {
  epmoe::Options options;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick"))
      options.quick = true;
    else if (!std::strcmp(argv[i], "--no-verify"))
      options.verify = false;
    else if (!std::strcmp(argv[i], "--fresh-sizes"))
      options.fresh_sizes = true;
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      options.threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--rows") && i + 1 < argc)
      options.rows = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--no-verify] [--fresh-sizes] [--threads N] [--rows M]\n", argv[0]);
      return 2;
    }
  }
  return epmoe::run(options);
}
