// bench_expert_product: one expert's f32 product as the MoE layer runs it
// (issue 29), on one thread, to choose two things by measurement:
//  * where the weights sit: oneDNN 2.6's gemm:jit on AVX2 runs the forward
//    (b not transposed) at other speeds depending on b's address (measured
//    on the AMD EPYC, 2026-12-07: 0.6 of the FMA peak with b on a 32-byte
//    boundary, as every expert matrix of a layer's weight tensor is, and
//    0.85 with b 16 bytes off it, at H=1024 F=512 M=64..512; the same bits).
//    Columns "b on grid" (b 2 MiB aligned, as a Tensor's large buffers)
//    and "b off grid" (b 16 bytes past that) call gemm() directly, with no
//    weight version: the kernel as it is. "per group" is the grouped forward
//    as the layer calls it (one group, weights on the grid, a weight
//    version): whatever kernels/gemm.cc's rule makes of it.
//  * row blocks (kernels/grouped_gemm.h, RowBlocking): the same group in
//    blocks of 64 rows ("row blocks", forced on, a weight version).
// Every column is interleaved with a short FMA loop (fma_peak.h) in the same
// rounds; GFLOP/s are the minimum time over the repetitions, and in
// brackets the fraction of the best FMA loop of that row. Verification: each
// column's output equals the first column's bit for bit, or within the
// f32 bound where row blocks change the bits.
//
//  * the backward's products (dlhs, drhs) with their operands on and off
//    the grid (--backward: only those tables), where gemm.cc keeps no copy.
//
//   bench_expert_product [--quick] [--backward] [--reps N]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_harness.h"
#include "core/rng.h"
#include "core/threading.h"
#include "fma_peak.h"
#include "kernels/gemm.h"
#include "kernels/grouped_gemm.h"

namespace epmoe {
namespace {

// A float buffer whose first element sits `offset_bytes` past a 2 MiB
// boundary (a Tensor's large buffers are 2 MiB aligned, core/buffer_cache.h).
class PlacedBuffer {
 public:
  PlacedBuffer(std::int64_t count, std::size_t offset_bytes)
      : storage_(static_cast<float*>(std::aligned_alloc(kAlignment, round_up((count + 64) * sizeof(float))))),
        data_(storage_.get() + offset_bytes / sizeof(float)) {}
  float* data() const { return data_; }

 private:
  static constexpr std::size_t kAlignment = std::size_t{2} << 20;
  static std::size_t round_up(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> storage_;
  float* data_;
};

struct Shape {
  std::int64_t k, n;  // forward: c[m, n] = a[m, k] b[k, n]
};

struct Column {
  const char* name;
  std::size_t b_offset_bytes;
  enum class Call { gemm, grouped_per_group, grouped_row_blocks } call;
};

// Times `products` interleaved with a short FMA loop in the same rounds and
// prints their table row: M, the FMA loop's GFLOP/s, and each product's
// GFLOP/s (minimum time) with its fraction of that loop's.
void measure_row(std::int64_t m, double flops, std::vector<std::function<void()>> products, int repetitions) {
  constexpr std::int64_t kFmaIterations = 20000;
  products.insert(products.begin(),
                  [] { [[maybe_unused]] volatile float sink = bench::detail::fma_loop(kFmaIterations, 1.0f); });
  const std::vector<bench::BenchStats> stats = bench::measure_interleaved(
      products, {.warmup_calls = 2, .min_repetition_seconds = 0.01, .repetitions = repetitions});
  const double peak =
      2.0 * bench::detail::kFmaLanes * bench::detail::kFmaChains * kFmaIterations / stats[0].min_seconds * 1e-9;
  std::printf("| %lld | %.0f |", static_cast<long long>(m), peak);
  for (std::size_t i = 1; i < stats.size(); ++i) {
    const double gflops = flops / stats[i].min_seconds * 1e-9;
    std::printf(" %.0f (%.2f) |", gflops, gflops / peak);
  }
  std::printf("\n");
  std::fflush(stdout);
}

// The backward's products at H=1024 F=512, where kernels/gemm.cc keeps no
// copy: dlhs dx = dout W^T (b = W transposed as stored) and drhs dW = x^T dout
// (a = x transposed, b = dout), with their operands on the grid and 16 bytes
// off it; every column must give the first column's bits.
bool run_backward(const std::vector<std::int64_t>& rows, int repetitions) {
  constexpr std::int64_t h = 1024, f = 512;
  const std::int64_t max_rows = rows.back();
  auto placed = [&](std::int64_t count, std::size_t offset_bytes) {
    PlacedBuffer buffer(count, offset_bytes);
    Rng values(17);
    for (std::int64_t i = 0; i < count; ++i) buffer.data()[i] = values.uniform(-1.0f, 1.0f);
    return buffer;
  };
  // [on grid, off grid] of each operand.
  const PlacedBuffer w[2] = {placed(h * f, 0), placed(h * f, 16)};
  const PlacedBuffer dout[2] = {placed(max_rows * f, 0), placed(max_rows * f, 16)};
  const PlacedBuffer x[2] = {placed(max_rows * h, 0), placed(max_rows * h, 16)};
  const char* names[] = {"on grid", "b off grid", "a off grid", "both off grid"};
  bool all_ok = true;
  for (const bool dlhs : {true, false}) {
    std::printf("\nH=%lld F=%lld %s, 1 thread, load average %s\n", static_cast<long long>(h), static_cast<long long>(f),
                dlhs ? "dlhs (dout W^T)" : "drhs (x^T dout)", bench::load_average().c_str());
    std::printf(
        "| M | FMA peak | on grid | b off grid | a off grid | both off grid |\n|---:|---:|---:|---:|---:|---:|\n");
    const std::int64_t out_count = dlhs ? max_rows * h : h * f;
    std::vector<PlacedBuffer> out;
    for (int i = 0; i < 4; ++i) out.emplace_back(out_count, 0);
    for (std::int64_t m : rows) {
      std::vector<std::function<void()>> calls;
      for (int i = 0; i < 4; ++i) {
        const int a_off = i >= 2 ? 1 : 0, b_off = i % 2;
        GemmArgs args = dlhs ? GemmArgs{.a = dout[a_off].data(),
                                        .b = w[b_off].data(),
                                        .c = out[i].data(),
                                        .m = m,
                                        .n = h,
                                        .k = f,
                                        .transpose_b = true,
                                        .dynamic_dim = GemmDynamicDim::m}
                             : GemmArgs{.a = x[a_off].data(),
                                        .b = dout[b_off].data(),
                                        .c = out[i].data(),
                                        .m = h,
                                        .n = f,
                                        .k = m,
                                        .transpose_a = true,
                                        .dynamic_dim = GemmDynamicDim::k};
        calls.push_back([args] { gemm(args); });
      }
      measure_row(m, 2.0 * double(m) * double(h) * double(f), std::move(calls), repetitions);
      const std::int64_t count = dlhs ? m * h : h * f;
      for (int i = 1; i < 4; ++i)
        if (std::memcmp(out[0].data(), out[i].data(), count * sizeof(float)) != 0) {
          std::fprintf(stderr, "verification failed: %s M=%lld %s differs from on grid\n", dlhs ? "dlhs" : "drhs",
                       static_cast<long long>(m), names[i]);
          all_ok = false;
        }
    }
  }
  return all_ok;
}

int run(bool quick, bool backward_only, int repetitions) {
  set_compute_threads(1);
  const std::vector<Shape> shapes = {{1024, 512}, {512, 1024}, {128, 256}, {256, 128}};
  const std::vector<std::int64_t> rows =
      quick ? std::vector<std::int64_t>{16, 64, 256, 1024}
            : std::vector<std::int64_t>{16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024};
  if (backward_only) {
    const bool ok = run_backward(rows, repetitions);
    std::printf("\nverification: %s\n", ok ? "passed" : "FAILED");
    return ok ? 0 : 1;
  }
  const std::vector<Column> columns = {
      {"b on grid", 0, Column::Call::gemm},
      {"b off grid", 16, Column::Call::gemm},
      {"per group", 0, Column::Call::grouped_per_group},
      {"row blocks", 0, Column::Call::grouped_row_blocks},
  };
  bool all_ok = true;
  for (const Shape& shape : shapes) {
    const std::int64_t max_rows = rows.back();
    Rng rng(7);
    PlacedBuffer a(max_rows * shape.k, 0);
    for (std::int64_t i = 0; i < max_rows * shape.k; ++i) a.data()[i] = rng.uniform(-1.0f, 1.0f);
    std::vector<PlacedBuffer> b, c;
    for (const Column& column : columns) {
      b.emplace_back(shape.k * shape.n, column.b_offset_bytes);
      c.emplace_back(max_rows * shape.n, 0);
    }
    Rng weights_rng(11);
    for (std::int64_t i = 0; i < shape.k * shape.n; ++i) {
      const float w = weights_rng.uniform(-1.0f, 1.0f);
      for (PlacedBuffer& buffer : b) buffer.data()[i] = w;
    }
    std::printf("\nH(k)=%lld F(n)=%lld forward, 1 thread, load average %s\n", static_cast<long long>(shape.k),
                static_cast<long long>(shape.n), bench::load_average().c_str());
    std::printf("| M | FMA peak |");
    for (const Column& column : columns) std::printf(" %s |", column.name);
    std::printf("\n|---:|---:|");
    for (std::size_t i = 0; i < columns.size(); ++i) std::printf("---:|");
    std::printf("\n");
    for (std::int64_t m : rows) {
      std::vector<std::int64_t> group_sizes = {m};
      std::vector<std::function<void()>> calls;
      for (std::size_t i = 0; i < columns.size(); ++i) {
        const Column& column = columns[i];
        float* out = c[i].data();
        const float* w = b[i].data();
        calls.push_back([&, column, out, w] {
          if (column.call == Column::Call::gemm) {
            gemm({.a = a.data(),
                  .b = w,
                  .c = out,
                  .m = m,
                  .n = shape.n,
                  .k = shape.k,
                  .dynamic_dim = GemmDynamicDim::m});
          } else {
            grouped_gemm_forward({.group_sizes = group_sizes,
                                  .k = shape.k,
                                  .n = shape.n,
                                  .weight_version = 1,
                                  .row_blocking = column.call == Column::Call::grouped_row_blocks ? RowBlocking::always
                                                                                                  : RowBlocking::never},
                                 a.data(), w, out);
          }
        });
      }
      measure_row(m, 2.0 * double(m) * double(shape.k) * double(shape.n), std::move(calls), repetitions);
      // Bits: the per-group columns against the first; row blocks within
      // the f32 bound of their inner size (tests/kernels/gemm_test.cc).
      for (std::size_t i = 1; i < columns.size(); ++i) {
        const bool blocks = columns[i].call == Column::Call::grouped_row_blocks;
        for (std::int64_t e = 0; e < m * shape.n; ++e) {
          const float want = c[0].data()[e], got = c[i].data()[e];
          const bool ok =
              blocks ? std::abs(got - want) <= 2 * shape.k * 0x1p-24 * shape.k : std::memcmp(&want, &got, 4) == 0;
          if (!ok) {
            std::fprintf(stderr, "verification failed: M=%lld %s element %lld: %.9g vs %.9g\n",
                         static_cast<long long>(m), columns[i].name, static_cast<long long>(e), got, want);
            all_ok = false;
            break;
          }
        }
      }
    }
  }
  all_ok = run_backward(rows, repetitions) && all_ok;
  std::printf("\nverification: %s\n", all_ok ? "passed" : "FAILED");
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace epmoe

int main(int argc, char** argv) {
  bool quick = false, backward_only = false;
  int repetitions = 15;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--backward")) {
      backward_only = true;
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      repetitions = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--backward] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  return epmoe::run(quick, backward_only, repetitions);
}
