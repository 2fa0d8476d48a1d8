// One expert's products on each candidate f32 GEMM library, side by side
// (issue 29): which library should run the grouped expert GEMMs?
//   forward  c[M, F] = x[M, H]  W[H, F]
//   dlhs     c[M, H] = dy[M, F] W[H, F]^T
//   drhs     c[H, F] = x[M, H]^T dy[M, F]
// at M = rows of one expert (16, 64, 256, 1024), for the layer's H=1024
// F=512 and the trainer's H=128 F=256, on 1 and 2 threads.
//
// Candidates (each built in when found; verification against the bound's
// result on by default):
//  * onednn-rt   oneDNN 2.6 matmul with the ragged dimension given at run
//                time (what kernels/gemm.cc ran before issue 29)
//  * onednn-fix  oneDNN 2.6 matmul of this exact shape, weights in the
//                primitive's own layout (format `any`), reordered once:
//                the fixed-shape pre-packed bound of issue 29 (drhs, which
//                has no weights, is a plain exact-shape primitive)
//  * onednn-new  dlhs only: the exact-shape primitive created per call
//  * onednn-wt   dlhs only: runtime M on W^T made once (see below)
//  * mkl         Intel MKL cblas_sgemm (PyPI wheel, GNU OpenMP layer)
//  * mkl-packed  MKL cblas_sgemm_pack once, cblas_sgemm_compute per call
//                (forward and dlhs: the weight is the packed operand)
//  * openblas    Debian's OpenBLAS (OpenMP build), loaded with dlopen so
//                that its cblas_sgemm does not collide with MKL's
//  * libxsmm     libxsmm 1.17 JIT kernels (Debian, static) on 64x64 output
//                tiles with the whole inner dimension; its JIT has no
//                transposed A, so dlhs uses W^T made once (a weight-version
//                cache would hold it) and drhs transposes x per call
//                (charged)
// Timing: all candidates of one shape interleaved with a short FMA-peak
// loop (fma_peak.h), min over 40 repetitions of a batch of calls (~2 ms);
// GFLOP/s beside the best FMA peak seen in the table's rounds and beside
// the bound; the load average printed per table. On a machine shared with
// other work the min over many short interleaved batches is what catches
// the quiet moments, for the peak and the candidates alike.
//
// Usage: bench_gemm_libraries [--quick] [--threads T]
#include <dlfcn.h>
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#if defined(EPMOE_HAVE_MKL)
#include <mkl.h>
#endif
#if defined(EPMOE_HAVE_LIBXSMM)
#include <libxsmm.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fma_peak.h"

namespace {

using Clock = std::chrono::steady_clock;
using dnnl::memory;

enum class Op { forward, dlhs, drhs };
const char* op_name(Op op) { return op == Op::forward ? "fwd" : op == Op::dlhs ? "dlhs" : "drhs"; }

// One product as a row-major GEMM sees it: c[m, n] = op(a)[m, k] op(b)[k, n].
struct Product {
  Op op;
  std::int64_t rows, hidden, ffn;  // M, H, F
  std::int64_t m, n, k;
  bool transpose_a, transpose_b;
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

Product make_product(Op op, std::int64_t rows, std::int64_t hidden, std::int64_t ffn) {
  switch (op) {
    case Op::forward:
      return {op, rows, hidden, ffn, rows, ffn, hidden, false, false};
    case Op::dlhs:
      return {op, rows, hidden, ffn, rows, hidden, ffn, false, true};
    case Op::drhs:
      break;
  }
  return {op, rows, hidden, ffn, hidden, ffn, rows, true, false};
}

// Operands: a is x or dy (or x for drhs), b the weight W [H, F] or dy.
struct Operands {
  std::vector<float> a, b, c;
  const float* weight() const { return b.data(); }
};

Operands make_operands(const Product& p) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Operands o;
  o.a.resize(p.m * p.k);
  o.b.resize(p.k * p.n);
  o.c.assign(p.m * p.n, 0.0f);
  for (float& v : o.a) v = dist(rng);
  for (float& v : o.b) v = dist(rng);
  return o;
}

// A candidate: prepared once per shape (primitive creation, weight packing:
// per weight version in a layer), then timed on run().
struct Candidate {
  std::string name;
  std::function<void()> run;
};

const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

memory::desc matrix(std::int64_t rows, std::int64_t cols, bool transposed) {
  return memory::desc({rows, cols}, memory::data_type::f32, transposed ? memory::dims{1, rows} : memory::dims{cols, 1});
}

// oneDNN 2.6: runtime M (forward; dlhs ran exact shapes before issue 29, see
// gemm.cc) or runtime K (drhs), or the exact shape with b in `any`.
Candidate onednn(const Product& p, Operands& o, bool fixed, std::string& implementation) {
  struct State {
    dnnl::matmul primitive;
    memory a, b, c;
    dnnl::stream stream{engine()};
  };
  auto s = std::make_shared<State>();
  const bool runtime_m = !fixed && p.op == Op::forward;
  const bool runtime_k = !fixed && p.op == Op::drhs;
  const std::int64_t m = runtime_m ? DNNL_RUNTIME_DIM_VAL : p.m, k = runtime_k ? DNNL_RUNTIME_DIM_VAL : p.k;
  const memory::desc a_desc = matrix(m, k, p.transpose_a);
  memory::desc b_desc = matrix(k, p.n, p.transpose_b);
  const bool pack = fixed && p.op != Op::drhs;
  if (pack) b_desc = memory::desc({p.k, p.n}, memory::data_type::f32, memory::format_tag::any);
  const memory::desc c_desc = matrix(m, p.n, false);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_desc, b_desc, c_desc), engine());
  implementation = pd.impl_info_str();
  s->primitive = dnnl::matmul(pd);
  s->a = memory(matrix(p.m, p.k, p.transpose_a), engine(), o.a.data());
  s->c = memory(matrix(p.m, p.n, false), engine(), o.c.data());
  memory plain_b(matrix(p.k, p.n, p.transpose_b), engine(), o.b.data());
  if (pack && pd.weights_desc() != plain_b.get_desc()) {
    s->b = memory(pd.weights_desc(), engine());
    dnnl::reorder(plain_b, s->b).execute(s->stream, plain_b, s->b);
    implementation += " (packed weights)";
  } else {
    s->b = plain_b;
  }
  return {fixed ? "onednn-fix" : "onednn-rt", [s] {
            s->primitive.execute(s->stream, {{DNNL_ARG_SRC, s->a}, {DNNL_ARG_WEIGHTS, s->b}, {DNNL_ARG_DST, s->c}});
          }};
}

// dlhs two more ways on oneDNN 2.6 (issue 29, item 2): the layer's groups
// change size every step, so the exact-shape primitive dlhs used (b
// transposed) is created anew per group and step ("onednn-new": creation
// included); or W^T [F, H] kept per weight version, so that dlhs is a
// forward-like product with the ragged M given at run time ("onednn-wt").
Candidate onednn_dlhs_new_shape(const Product& p, Operands& o) {
  auto stream = std::make_shared<dnnl::stream>(engine());
  return {"onednn-new", [&p, &o, stream] {
            const memory::desc a = matrix(p.m, p.k, false), b = matrix(p.k, p.n, true), c = matrix(p.m, p.n, false);
            const dnnl::matmul primitive(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), engine()));
            memory a_mem(a, engine(), o.a.data()), b_mem(b, engine(), o.b.data()), c_mem(c, engine(), o.c.data());
            primitive.execute(*stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
          }};
}

Candidate onednn_dlhs_transposed_copy(const Product& p, Operands& o) {
  struct State {
    std::vector<float> wt;  // W^T, [F, H] row-major = b as [k, n] plain
    dnnl::matmul primitive;
    dnnl::stream stream{engine()};
  };
  auto s = std::make_shared<State>();
  s->wt.resize(p.k * p.n);
  for (std::int64_t i = 0; i < p.n; ++i)
    for (std::int64_t j = 0; j < p.k; ++j) s->wt[j * p.n + i] = o.b[i * p.k + j];
  const memory::desc a = matrix(DNNL_RUNTIME_DIM_VAL, p.k, false), b = matrix(p.k, p.n, false),
                     c = matrix(DNNL_RUNTIME_DIM_VAL, p.n, false);
  s->primitive = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), engine()));
  return {"onednn-wt", [&p, &o, s] {
            memory a_mem(matrix(p.m, p.k, false), engine(), o.a.data());
            memory b_mem(matrix(p.k, p.n, false), engine(), s->wt.data());
            memory c_mem(matrix(p.m, p.n, false), engine(), o.c.data());
            s->primitive.execute(s->stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
          }};
}

#if defined(EPMOE_HAVE_MKL)
Candidate mkl_plain(const Product& p, Operands& o) {
  return {"mkl", [&p, &o] {
            cblas_sgemm(CblasRowMajor, p.transpose_a ? CblasTrans : CblasNoTrans,
                        p.transpose_b ? CblasTrans : CblasNoTrans, p.m, p.n, p.k, 1.0f, o.a.data(),
                        p.transpose_a ? p.m : p.k, o.b.data(), p.transpose_b ? p.k : p.n, 0.0f, o.c.data(), p.n);
          }};
}

// The weight (b) packed once into MKL's internal layout.
Candidate mkl_packed(const Product& p, Operands& o) {
  const std::size_t bytes = cblas_sgemm_pack_get_size(CblasBMatrix, p.m, p.n, p.k);
  auto packed = std::shared_ptr<float>(static_cast<float*>(mkl_malloc(bytes, 64)), mkl_free);
  cblas_sgemm_pack(CblasRowMajor, CblasBMatrix, p.transpose_b ? CblasTrans : CblasNoTrans, p.m, p.n, p.k, 1.0f,
                   o.b.data(), p.transpose_b ? p.k : p.n, packed.get());
  return {"mkl-packed", [&p, &o, packed] {
            cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, p.m, p.n, p.k, o.a.data(), p.k, packed.get(),
                                p.n, 0.0f, o.c.data(), p.n);
          }};
}
#endif

// OpenBLAS through dlopen: its own symbols first (RTLD_DEEPBIND), none of
// them visible to the rest of the process (RTLD_LOCAL).
using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
SgemmFn openblas_sgemm() {
  static SgemmFn fn = [] {
    void* lib =
        dlopen("/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0", RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    return lib ? reinterpret_cast<SgemmFn>(dlsym(lib, "cblas_sgemm")) : nullptr;
  }();
  return fn;
}

Candidate openblas(const Product& p, Operands& o) {
  constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // cblas.h's values
  return {"openblas", [&p, &o] {
            openblas_sgemm()(kRowMajor, p.transpose_a ? kTrans : kNoTrans, p.transpose_b ? kTrans : kNoTrans, p.m, p.n,
                             p.k, 1.0f, o.a.data(), p.transpose_a ? p.m : p.k, o.b.data(), p.transpose_b ? p.k : p.n,
                             0.0f, o.c.data(), p.n);
          }};
}

#if defined(EPMOE_HAVE_LIBXSMM)
// Row-major c[m, n] = a[m, k] b[k, n] as libxsmm's column-major kernel
// c^T = b^T a^T on 64x64 tiles of c, tiles spread over the threads.
Candidate libxsmm(const Product& p, Operands& o) {
  constexpr std::int64_t kTile = 64;
  struct State {
    std::vector<float> b_plain;  // b without transpose ([k, n])
    std::vector<float> a_plain;  // a without transpose ([m, k]), drhs: per call
    libxsmm_smmfunction full = nullptr, edge_n = nullptr, edge_m = nullptr, edge_both = nullptr;
  };
  auto s = std::make_shared<State>();
  if (p.transpose_b) {  // dlhs: W^T [F, H] once, as a weight-version cache would hold it
    s->b_plain.resize(p.k * p.n);
    for (std::int64_t i = 0; i < p.n; ++i)
      for (std::int64_t j = 0; j < p.k; ++j) s->b_plain[j * p.n + i] = o.b[i * p.k + j];
  }
  if (p.transpose_a) s->a_plain.resize(p.m * p.k);
  const libxsmm_blasint lda = p.n, ldb = p.k, ldc = p.n;  // column-major view
  const float alpha = 1.0f, beta = 0.0f;
  const int flags = LIBXSMM_GEMM_FLAG_NONE, prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
  auto dispatch = [&](std::int64_t tile_n, std::int64_t tile_m) {
    return libxsmm_smmdispatch(tile_n, tile_m, p.k, &lda, &ldb, &ldc, &alpha, &beta, &flags, &prefetch);
  };
  const std::int64_t n_edge = p.n % kTile == 0 ? kTile : p.n % kTile;
  const std::int64_t m_edge = p.m % kTile == 0 ? kTile : p.m % kTile;
  s->full = dispatch(std::min(kTile, p.n), std::min(kTile, p.m));
  s->edge_n = dispatch(n_edge, std::min(kTile, p.m));
  s->edge_m = dispatch(std::min(kTile, p.n), m_edge);
  s->edge_both = dispatch(n_edge, m_edge);
  if (!s->full || !s->edge_n || !s->edge_m || !s->edge_both) return {"libxsmm", nullptr};
  return {"libxsmm", [&p, &o, s] {
            const float* a = o.a.data();
            if (p.transpose_a) {  // drhs: x^T made here, every call
#pragma omp parallel for
              for (std::int64_t i = 0; i < p.m; ++i)
                for (std::int64_t j = 0; j < p.k; ++j) s->a_plain[i * p.k + j] = o.a[j * p.m + i];
              a = s->a_plain.data();
            }
            const float* b = p.transpose_b ? s->b_plain.data() : o.b.data();
            const std::int64_t tiles_m = (p.m + kTile - 1) / kTile, tiles_n = (p.n + kTile - 1) / kTile;
#pragma omp parallel for schedule(static)
            for (std::int64_t t = 0; t < tiles_m * tiles_n; ++t) {
              const std::int64_t tm = t / tiles_n, tn = t % tiles_n;
              const bool last_m = tm == tiles_m - 1 && p.m % kTile != 0, last_n = tn == tiles_n - 1 && p.n % kTile != 0;
              const libxsmm_smmfunction kernel =
                  last_m ? (last_n ? s->edge_both : s->edge_m) : (last_n ? s->edge_n : s->full);
              kernel(b + tn * kTile, a + tm * kTile * p.k, o.c.data() + tm * kTile * p.n + tn * kTile);
            }
          }};
}
#endif

// Seconds per call: min over `repetitions` of a batch of `calls` calls.
double time_call(const std::function<void()>& run, int calls) {
  const auto start = Clock::now();
  for (int i = 0; i < calls; ++i) run();
  return std::chrono::duration<double>(Clock::now() - start).count() / calls;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five;
  in >> one >> five;
  return one + " " + five;
}

void set_threads(int threads) {
  omp_set_num_threads(threads);
#if defined(EPMOE_HAVE_MKL)
  mkl_set_num_threads(threads);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::vector<int> thread_counts = {1, 2};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--threads" && i + 1 < argc) {
      thread_counts = {std::atoi(argv[++i])};
    } else {
      std::fprintf(stderr, "usage: bench_gemm_libraries [--quick] [--threads T]\n");
      return 2;
    }
  }
#if defined(EPMOE_HAVE_LIBXSMM)
  libxsmm_init();
#endif
  const int repetitions = quick ? 3 : 40;
  const double batch_seconds = quick ? 0.005 : 0.002;
  std::printf("candidates: onednn-rt onednn-fix%s%s%s%s\n",
#if defined(EPMOE_HAVE_MKL)
              " mkl mkl-packed",
#else
              "",
#endif
              openblas_sgemm() ? " openblas" : "",
#if defined(EPMOE_HAVE_LIBXSMM)
              " libxsmm",
#else
              "",
#endif
              "");
  bool all_verified = true;
  for (int threads : thread_counts) {
    set_threads(threads);
    double peak = epmoe::bench::measure_fma_peak(threads).gflops;
    std::printf("\n== %d thread(s), load average %s\n", threads, load_average().c_str());
    std::printf("%-5s %-5s %-5s %-5s | FMA peak GFLOP/s | GFLOP/s per candidate (/ FMA peak, / onednn-fix)\n", "H", "F",
                "op", "M");
    for (auto [hidden, ffn] : {std::pair<std::int64_t, std::int64_t>{1024, 512}, {128, 256}}) {
      for (Op op : {Op::forward, Op::dlhs, Op::drhs}) {
        for (std::int64_t rows : {16, 64, 256, 1024}) {
          const Product p = make_product(op, rows, hidden, ffn);
          Operands o = make_operands(p);
          std::string bound_impl, runtime_impl;
          std::vector<Candidate> candidates;
          candidates.push_back(onednn(p, o, true, bound_impl));
          candidates.push_back(onednn(p, o, false, runtime_impl));
          if (op == Op::dlhs) {
            candidates.push_back(onednn_dlhs_new_shape(p, o));
            candidates.push_back(onednn_dlhs_transposed_copy(p, o));
          }
#if defined(EPMOE_HAVE_MKL)
          candidates.push_back(mkl_plain(p, o));
          if (op != Op::drhs) candidates.push_back(mkl_packed(p, o));
#endif
          if (openblas_sgemm()) candidates.push_back(openblas(p, o));
#if defined(EPMOE_HAVE_LIBXSMM)
          if (Candidate c = libxsmm(p, o); c.run) candidates.push_back(std::move(c));
#endif
          // Verification: every candidate's c against the bound's.
          candidates[0].run();
          const std::vector<float> expected = o.c;
          float scale = 0;
          for (float v : expected) scale = std::max(scale, std::abs(v));
          std::vector<int> calls(candidates.size());
          std::vector<double> best(candidates.size(), 1e30);
          for (std::size_t c = 0; c < candidates.size(); ++c) {
            std::fill(o.c.begin(), o.c.end(), std::nanf(""));
            candidates[c].run();
            float error = 0;
            for (std::size_t i = 0; i < expected.size(); ++i) error = std::max(error, std::abs(o.c[i] - expected[i]));
            if (!(error <= 1e-5f * scale * std::sqrt(float(p.k)))) {
              std::printf("VERIFY FAILED: %s %s M=%ld max error %g (scale %g)\n", candidates[c].name.c_str(),
                          op_name(op), long(rows), error, scale);
              all_verified = false;
            }
            calls[c] = std::max(1, int(batch_seconds / std::max(time_call(candidates[c].run, 1), 1e-7)));
          }
          for (int rep = 0; rep < repetitions; ++rep) {
            for (std::size_t c = 0; c < candidates.size(); ++c)
              best[c] = std::min(best[c], time_call(candidates[c].run, calls[c]));
            peak = std::max(peak, epmoe::bench::measure_fma_peak(threads, batch_seconds / 2, 1).gflops);
          }
          std::printf("%-5ld %-5ld %-5s %-5ld | %.1f |", long(hidden), long(ffn), op_name(op), long(rows), peak);
          for (std::size_t c = 0; c < candidates.size(); ++c) {
            const double gflops = p.flops() / best[c] * 1e-9;
            std::printf(" %s %.1f (%.2f, %.2f)", candidates[c].name.c_str(), gflops, gflops / peak, best[0] / best[c]);
          }
          std::printf("   [fix: %s; rt: %s]\n", bound_impl.c_str(), runtime_impl.c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  std::printf("\nverification: %s\n",
              all_verified ? "all candidates within 1e-5 * max|c| * sqrt(k) of the bound" : "FAILED (see above)");
  return all_verified ? 0 : 1;
}
