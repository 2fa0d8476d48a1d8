// Dense GEMM on oneDNN's matmul, row-major, contiguous operands:
//   c[m, n] (+)= op(a)[m, k] * op(b)[k, n]
// op(a) = a ([m, k]) or a^T (a stored [k, m]); op(b) = b ([k, n]) or b^T
// (b stored [n, k]). `accumulate` adds into c instead of overwriting it.
// Why oneDNN and not OpenBLAS: DESIGN.md §4.3 (~2x on this machine's cores).
// Primitives are cached per (shape, transposes, dtype, accumulate, threads),
// so a repeated shape costs one lookup, not a primitive creation.
// Thread-safe: every calling thread (rank threads, OpenMP workers) owns its
// primitive cache, oneDNN stream and bf16 operand scratch, so calls never
// lock. Runs on the calling thread's compute budget (core/threading.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/compute_dtype.h"

namespace epmoe {

// Which dimension, if any, changes from call to call (the ragged groups of a
// grouped GEMM). oneDNN then builds one primitive with that dimension given at
// run time instead of one per shape; see gemm.cc for the measured trade.
// Honoured when the operand strides do not depend on it (m: a not transposed;
// k: a transposed, b not) and not for f32 with b transposed, where the
// runtime-dimension kernel measured slower; otherwise the exact shape is cached.
enum class GemmDynamicDim { none, m, k };

struct GemmArgs {
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  bool transpose_a = false;
  bool transpose_b = false;
  bool accumulate = false;
  ComputeDType compute_dtype = ComputeDType::f32;
  GemmDynamicDim dynamic_dim = GemmDynamicDim::none;
  // Identifies b's values (a weight version; 0 = unknown). With a non-zero
  // version, what is derived from b alone is computed once and kept until
  // b's pointer, shape or version changes (a shared cache, see
  // gemm_weight_cache_stats): its bf16 copy for compute_dtype=bf16 (the same
  // conversion, so the same bits), with pack_b its reorder, and for an f32
  // product with b not transposed, b on a 32-byte boundary, m >= 32 and
  // n >= 256 an f32 copy of b 16 bytes off that grid, where oneDNN 2.6's
  // gemm:jit runs 1.3-1.9x faster on AVX2 at the layer's shapes, with the
  // same bits (gemm.cc, uses_off_grid_b; docs/BENCHMARKS.md, issue 29).
  std::uint64_t b_version = 0;
  // Needs b_version: let oneDNN pick b's layout (format `any`) for an
  // exact-shape primitive and keep b reordered into it. The grouped
  // products' row blocks set it (kernels/grouped_gemm.h, RowBlocking). Where oneDNN's choice
  // is the plain layout (every f32 matmul of oneDNN 2.6 on AVX2: gemm:jit) the
  // call takes the default path, bit for bit. Where it picks a blocked layout
  // (brgemm, AVX-512) the kernel differs from the default path's, so the
  // result may differ in the last bits, within the same f32 (or bf16)
  // accumulation bound as any oneDNN kernel (tests/kernels/gemm_test.cc).
  bool pack_b = false;
  // The operation's name on a trace's compute track (core/trace_recorder.h).
  const char* trace_name = "gemm";
};

// f32 products of at most kFewRows (4) rows with a and b as stored (an
// expert's forward with a few tokens) run on few_rows_gemm, one pass over b
// that ran at 1.29x oneDNN's speed there (kernels/few_rows_gemm.h);
// with EPMOE_F32_GEMM=openblas every f32 product runs on OpenBLAS.
// m, n or k may be zero: then c is left alone (accumulate) or zero-filled.
// compute_dtype=bf16 where oneDNN has no bf16 matmul on this CPU (its bf16
// kernels need AVX-512; on an AVX2-only AMD EPYC, 2026-12-01, every bf16
// primitive failed) throws ConfigError naming the key and the shape.
//
// Modelled time: 2mnk FLOPs, and the operands' bytes at the device's operand
// width (2 bytes: f32 here stands for the device's bf16) plus the f32 output
// (core/modelled_clock.h).
void gemm(const GemmArgs& args);

// Which library runs compute_dtype=f32 products, read once per process from
// the environment variable EPMOE_F32_GEMM: "onednn" (default, or unset) or
// "openblas" (opt-in; a build found OpenBLAS's OpenMP build). Measured on the
// AVX2-only AMD EPYC (2026-12-01, busy machine, 1 thread), where oneDNN 2.6.3
// serves every f32 matmul with gemm:jit at 0.5-0.7 of the FMA peak: OpenBLAS
// 0.3.21 ran the grouped forward 1.0-1.6x faster but the weight gradient
// (a transposed) 0.6-0.9x, the whole layer ~1.1x: no clear win, so not the
// default (docs/BENCHMARKS.md, issue 15).
// Another library sums in another order: bits differ from the default's
// (within the same f32 bound, tests/kernels), so it is opt-in, per process,
// and every configuration compared bit for bit inside one process uses the
// same one. Any other value, or openblas in a build without it: ConfigError
// naming EPMOE_F32_GEMM at the first f32 gemm.
enum class F32GemmBackend { onednn, openblas };
F32GemmBackend f32_gemm_backend();

// Which implementation ran the products: per (implementation, dtype), the
// calls, their FLOPs (2mnk) and the primitives created since the process
// started or the last reset_gemm_implementation_census(), most FLOPs first,
// only those with a call or a creation.
// The implementation is oneDNN's own name for the primitive it picked
// (`impl_info_str`: "gemm:jit" for every f32 matmul of oneDNN 2.6 on AVX2,
// "brg:avx512_core", "brg:avx512_core_amx" where its brgemm kernels run),
// "openblas" (EPMOE_F32_GEMM=openblas), or "epmoe:few_rows" (f32 products
// of at most kFewRows rows, a and b as stored: kernels/few_rows_gemm.h).
// Issue 29 asked whether the expert
// products reach the brgemm / AMX kernels; this answers it for any run
// without ONEDNN_VERBOSE (bench_moe_layer prints it for one step). Counting
// is two relaxed atomic adds per call; products with m, n or k = 0 run
// nothing and are not counted.
struct GemmImplementationUse {
  std::string implementation;
  ComputeDType compute_dtype = ComputeDType::f32;
  std::int64_t calls = 0;
  std::int64_t flops = 0;
  std::int64_t primitives = 0;  // created (100-230 us each for a new exact shape)
};
std::vector<GemmImplementationUse> gemm_implementation_census();
void reset_gemm_implementation_census();

// Whether an f32 product with b transposed and a new m every call (the
// grouped dlhs) runs with m given at run time: true where that primitive is
// the implementation the exact shape would get (gemm:jit for both on AVX2:
// one primitive serves every m, the same bits), false where the exact shape
// reaches another kernel (brgemm on AVX-512, 1.2-1.4x gemm:jit there), which
// is then created per new m. Probed once per thread and shape.
bool gemm_runtime_m_keeps_the_kernel(std::int64_t n, std::int64_t k, bool transpose_b, ComputeDType dtype);

// Whether oneDNN, for an exact-shape product of this shape on one thread
// with b's layout left to it (format `any`), picks a layout of its own for b
// (a blocked one: its brgemm-class kernels, AVX-512 and AMX) rather than a
// plain one (gemm:jit: every f32 matmul of oneDNN 2.6 on AVX2, where this
// answers false). Then keeping b packed per weight version and running
// fixed-shape blocks of rows is what reaches those kernels (kernels/
// grouped_gemm.h, RowBlocking). Probed once per shape and process; false
// where the primitive cannot be created (bf16 on AVX2).
bool gemm_packs_weights(std::int64_t m, std::int64_t n, std::int64_t k, bool transpose_b, ComputeDType dtype);

// Whether oneDNN offers bf16 x bf16 -> f32 matmul on this CPU (probed once
// with a 2x2 product), so that a caller can refuse
// compute_dtype=bf16 up front and tests can skip what this CPU cannot run.
bool bf16_gemm_supported();

// The shared cache of prepared b operands (b_version != 0): one entry per
// (b pointer, k, n, dtype), replaced when the version changes, all dropped
// beyond kMaxGemmWeightEntries entries or by clear_gemm_weight_cache().
struct GemmWeightCacheStats {
  std::int64_t entries = 0;
  std::int64_t bytes = 0;         // of bf16 copies and packed layouts held
  std::int64_t preparations = 0;  // bf16 conversions and reorders done (since start)
  std::int64_t reuses = 0;        // calls served from a prepared operand (since start)
};
GemmWeightCacheStats gemm_weight_cache_stats();
// Bytes the cache holds for these b matrices (keyed by pointer; every dtype
// and layout kept for them): what their owner charges to its memory ledger.
std::int64_t gemm_weight_cache_bytes(std::span<const float* const> matrices);
void clear_gemm_weight_cache();
constexpr std::int64_t kMaxGemmWeightEntries = 4096;

}  // namespace epmoe
