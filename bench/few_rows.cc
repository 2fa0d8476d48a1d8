// bench_few_rows: the expert products at 1-32 rows per expert (issue 29,
// item 3: "a small-M path chosen by measurement"), the regime of decoding
// and of many experts per rank. With few rows a product is bound by reading
// its weights: M rows of x against a W of H x F floats do 2 M flops per
// weight, so below ~8 rows (f32, one core here) no kernel can beat the time
// to stream W from memory once. That bound is measured in the same rounds
// (a vectorised read of a 256 MiB buffer) beside the FMA peak; each
// product's time is printed as a fraction of max(weights / read bandwidth,
// flops / FMA peak).
//
// Products, one thread (the layer runs a small group on one thread), W in a
// Tensor's placement (64-byte aligned):
//   fwd   c[M, n] = x[M, k] W[k, n]       up (k=H, n=F) and down (k=F, n=H)
//   dlhs  c[M, n] = d[M, k] W[n, k]^T     dx of the up projection (k=F, n=H)
// Weights "cold": one W per expert, as many experts as make 256 MiB (8x
// this machine's L3), cycled, so every call streams its W from memory as a
// decode step does; "warm": one W called again and again (in cache when it
// fits), as a training step's repeated products are not.
// Candidates:
//   onednn    oneDNN 2.6 with M given at run time, as kernels/gemm.cc ran
//             every f32 forward and dlhs before the few-rows rule
//   openblas  Debian's OpenBLAS (OpenMP build), cblas_sgemm
//   epmoe     epmoe::gemm as grouped_gemm calls it (runtime M, a weight
//             version): whatever kernels/gemm.cc's rules pick
// Each candidate's output is checked against the first's (within the f32
// bound; the same library gives the same bits). The last line sums up the
// rule: epmoe's speed over oneDNN's in the cells where gemm() took the
// few-rows kernel (bench/expert_gemm_goals.sh prints it on every machine).
//
//   bench_few_rows [--quick] [--rows M1,M2,...]
#include <cblas.h>
#include <unistd.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <epmoe/tensor.h>

#include "bench_harness.h"
#include "core/threading.h"
#include "fma_peak.h"
#include "kernels/gemm.h"

extern "C" void openblas_set_num_threads(int);

namespace epmoe {
namespace {

using Clock = std::chrono::steady_clock;
using dnnl::memory;

// Buffers are Tensors: where the layer's weights sit (64-byte aligned).
float* floats(Tensor& t) { return t.data<float>(); }

// Bytes per second of a vectorised sum over a buffer 8x the L3 (best of the
// calls made so far): the rate at which one core streams weights from memory.
class ReadBandwidth {
 public:
  ReadBandwidth() : buffer_(DType::f32, {kFloats}) {
    for (float& v : buffer_.span<float>()) v = 1.0f;
  }
  void measure() {
    using Lanes = float __attribute__((vector_size(32)));
    const auto start = Clock::now();
    Lanes sum[4] = {};
    const Lanes* v = reinterpret_cast<const Lanes*>(floats(buffer_));
    for (std::int64_t i = 0; i < kFloats / 8; i += 4)
      for (int j = 0; j < 4; ++j) sum[j] += v[i + j];
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    sink_ = sink_ + sum[0][0] + sum[1][1] + sum[2][2] + sum[3][3];
    best_ = std::max(best_, kFloats * 4.0 / seconds);
  }
  double bytes_per_second() const { return best_; }

 private:
  static constexpr std::int64_t kFloats = std::int64_t{64} << 20;  // 256 MiB
  Tensor buffer_;
  double best_ = 0;
  volatile float sink_ = 0;
};

struct Product {
  const char* name;
  std::int64_t m, n, k;
  bool transpose_b;
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

struct Operands {
  std::vector<Tensor> weights;  // one per expert, [k, n] or [n, k]
  Tensor a, c;
  Operands(const Product& p, int experts) : a(DType::f32, {p.m, p.k}), c(DType::f32, {p.m, p.n}) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int e = 0; e < experts; ++e) {
      weights.emplace_back(DType::f32, Shape{p.k, p.n});
      for (float& v : weights.back().span<float>()) v = dist(rng);
    }
    for (float& v : a.span<float>()) v = dist(rng);
  }
};

// One call of a candidate: the product against expert e's weights.
using Call = std::function<void(int e)>;

memory::desc matrix(std::int64_t rows, std::int64_t cols, bool transposed) {
  return memory::desc({rows, cols}, memory::data_type::f32, transposed ? memory::dims{1, rows} : memory::dims{cols, 1});
}

Call onednn_runtime_m(const Product& p, Operands& o) {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  struct State {
    dnnl::matmul primitive;
    dnnl::stream stream{engine};
  };
  auto s = std::make_shared<State>();
  s->primitive = dnnl::matmul(dnnl::matmul::primitive_desc(
      dnnl::matmul::desc(matrix(DNNL_RUNTIME_DIM_VAL, p.k, false), matrix(p.k, p.n, p.transpose_b),
                         matrix(DNNL_RUNTIME_DIM_VAL, p.n, false)),
      engine));
  return [&p, &o, s](int e) {
    memory a(matrix(p.m, p.k, false), engine, floats(o.a)),
        b(matrix(p.k, p.n, p.transpose_b), engine, floats(o.weights[e])),
        c(matrix(p.m, p.n, false), engine, floats(o.c));
    s->primitive.execute(s->stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  };
}

Call openblas(const Product& p, Operands& o) {
  return [&p, &o](int e) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, p.transpose_b ? CblasTrans : CblasNoTrans, int(p.m), int(p.n), int(p.k),
                1.0f, floats(o.a), int(p.k), floats(o.weights[e]), int(p.transpose_b ? p.k : p.n), 0.0f, floats(o.c),
                int(p.n));
  };
}

Call epmoe_gemm(const Product& p, Operands& o) {
  return [&p, &o](int e) {
    gemm({.a = floats(o.a),
          .b = floats(o.weights[e]),
          .c = floats(o.c),
          .m = p.m,
          .n = p.n,
          .k = p.k,
          .transpose_b = p.transpose_b,
          .dynamic_dim = GemmDynamicDim::m,
          .b_version = static_cast<std::uint64_t>(e + 1),
          .trace_name = "few rows"});
  };
}

}  // namespace
}  // namespace epmoe

int main(int argc, char** argv) {
  using namespace epmoe;
  bool quick = false;
  std::vector<std::int64_t> rows_given;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--rows" && i + 1 < argc) {
      for (const char* p = argv[++i]; *p != '\0';) {
        char* end = nullptr;
        const long rows = std::strtol(p, &end, 10);
        if (end == p || rows < 1) {
          std::fprintf(stderr, "--rows: a comma-separated list of row counts >= 1, got '%s'\n", argv[i]);
          return 2;
        }
        rows_given.push_back(rows);
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr, "usage: bench_few_rows [--quick] [--rows M1,M2,...]\n");
      return 2;
    }
  }
  set_compute_threads(1);
  openblas_set_num_threads(1);
  const int repetitions = quick ? 3 : 9;
  const std::int64_t cold_bytes = std::int64_t{256} << 20;
  ReadBandwidth bandwidth;
  double peak = bench::measure_fma_peak(1).gflops;
  bandwidth.measure();
  std::printf("one thread; load average %s; L3 %ld KiB\n", bench::load_average().c_str(),
              sysconf(_SC_LEVEL3_CACHE_SIZE) / 1024);
  std::printf(
      "columns: us per product (fraction of the bound max(W bytes / read bandwidth, flops / FMA peak)); last: the "
      "implementation(s) epmoe's calls ran on\n");
  bool verified = true;
  std::vector<double> few_rows_speedups;  // oneDNN's time / gemm()'s, where gemm() took the few-rows kernel
  struct Shape {
    std::int64_t hidden, ffn;
  };
  const std::vector<Shape> shapes =
      quick ? std::vector<Shape>{{1024, 512}} : std::vector<Shape>{{128, 256}, {1024, 512}, {2048, 768}, {7168, 2048}};
  const std::vector<std::int64_t> row_counts = !rows_given.empty() ? rows_given
                                               : quick             ? std::vector<std::int64_t>{1, 2, 4, 8, 16, 32}
                                                       : std::vector<std::int64_t>{1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
  for (const Shape& shape : shapes) {
    for (bool cold : {true, false}) {
      std::printf("\n== H=%ld F=%ld, weights %s\n", long(shape.hidden), long(shape.ffn),
                  cold ? "cold (one per expert, 256 MiB cycled)" : "warm (one, repeated)");
      std::printf("%-9s %4s | %8s %7s %7s | %-20s %-20s %-20s\n", "product", "M", "bound us", "GB/s", "GFLOP/s",
                  "onednn", "openblas", "epmoe");
      for (const char* which : {"fwd-up", "fwd-down", "dlhs-up"}) {
        for (std::int64_t rows : row_counts) {
          const std::string name = which;
          const Product p = name == "fwd-up"     ? Product{which, rows, shape.ffn, shape.hidden, false}
                            : name == "fwd-down" ? Product{which, rows, shape.hidden, shape.ffn, false}
                                                 : Product{which, rows, shape.hidden, shape.ffn, true};
          const std::int64_t weight_bytes = p.k * p.n * 4;
          const int experts = cold ? int(std::max<std::int64_t>(2, cold_bytes / weight_bytes)) : 1;
          Operands o(p, experts);
          reset_gemm_implementation_census();
          const std::vector<Call> calls = {onednn_runtime_m(p, o), openblas(p, o), epmoe_gemm(p, o)};
          // Verification against the first candidate's output, expert 0.
          std::vector<float> expected;
          double scale = 0;
          for (std::size_t c = 0; c < calls.size(); ++c) {
            std::fill(floats(o.c), floats(o.c) + p.m * p.n, std::nanf(""));
            calls[c](0);
            if (c == 0) {
              expected.assign(floats(o.c), floats(o.c) + p.m * p.n);
              for (float v : expected) scale = std::max(scale, double(std::abs(v)));
              continue;
            }
            for (std::int64_t i = 0; i < p.m * p.n; ++i) {
              if (!(std::abs(floats(o.c)[i] - expected[i]) <= 1e-5 * scale * std::sqrt(double(p.k)))) {
                std::printf("VERIFY FAILED: candidate %zu, %s M=%ld\n", c, which, long(rows));
                verified = false;
                break;
              }
            }
          }
          // A batch: every expert once (cold), or as many calls as that (warm).
          const int batch = cold ? experts : std::max(1, int(cold_bytes / weight_bytes / 4));
          std::vector<double> best(calls.size(), 1e30);
          for (int rep = 0; rep < repetitions; ++rep) {
            for (std::size_t c = 0; c < calls.size(); ++c) {
              const auto start = Clock::now();
              for (int i = 0; i < batch; ++i) calls[c](cold ? i : 0);
              best[c] = std::min(best[c], std::chrono::duration<double>(Clock::now() - start).count() / batch);
            }
            peak = std::max(peak, bench::measure_fma_peak(1, 0.002, 1).gflops);
            if (cold) bandwidth.measure();
          }
          const double bound =
              std::max(cold ? weight_bytes / bandwidth.bytes_per_second() : 0.0, p.flops() / (peak * 1e9));
          std::printf("%-9s %4ld | %8.1f %7.1f %7.1f |", which, long(rows), bound * 1e6,
                      bandwidth.bytes_per_second() * 1e-9, peak);
          for (double t : best) {
            char cell[32];
            std::snprintf(cell, sizeof cell, "%.1f (%.2f)", t * 1e6, bound / t);
            std::printf(" %-20s", cell);
          }
          for (const GemmImplementationUse& use : gemm_implementation_census()) {
            std::printf(" %s", use.implementation.c_str());
            if (use.implementation == "epmoe:few_rows") few_rows_speedups.push_back(best[0] / best[2]);
          }
          std::printf("\n");
          std::fflush(stdout);
        }
      }
    }
  }
  if (!few_rows_speedups.empty()) {
    double log_sum = 0;
    for (double r : few_rows_speedups) log_sum += std::log(r);
    std::printf(
        "\nfew rows: epmoe / oneDNN speed where gemm() took the few-rows kernel: geometric mean %.2f, "
        "min %.2f, max %.2f over %zu cells\n",
        std::exp(log_sum / double(few_rows_speedups.size())),
        *std::min_element(few_rows_speedups.begin(), few_rows_speedups.end()),
        *std::max_element(few_rows_speedups.begin(), few_rows_speedups.end()), few_rows_speedups.size());
  }
  std::printf("\nverification: %s\n",
              verified ? "every candidate within 1e-5 * max|c| * sqrt(k) of onednn's" : "FAILED");
  return verified ? 0 : 1;
}
