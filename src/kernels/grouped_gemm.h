// Grouped GEMM: the rows of a matrix are sorted by group (expert), each group
// multiplies its own weight matrix. With G groups, group g owning rows
// [offset_g, offset_g + group_sizes[g]) of the M rows:
//   forward: out_g  = x_g    W_g      x [M, K], W [G, K, N], out [M, N]
//   dlhs:    dx_g   = dout_g W_g^T    dout [M, N], dx [M, K]
//   drhs:    dW_g   = x_g^T  dout_g   dW [G, K, N]; zero for an empty group
// Accumulation in fp32; compute_dtype selects f32 or bf16 operands.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "kernels/compute_dtype.h"

namespace epmoe {

// How groups share the caller's threads.
//  * balanced (default): a group with more than its fair share of the rows
//    (M / threads) runs on all threads, one such group after another; all
//    other groups run side by side, one thread each, largest first.
//  * one_group_at_a_time: every group on all threads in turn, the naive
//    schedule; kept so that benchmarks can measure what balanced buys.
enum class GroupSchedule { balanced, one_group_at_a_time };

// Row blocks (issue 29): forward and dlhs as one task space of (group,
// block of up to kRowBlockRows rows) spread over the caller's threads, one
// thread each, every full block on one fixed-shape primitive (kRowBlockRows
// x n x k) whose weights oneDNN keeps packed in its own layout per weight
// version (GemmArgs::pack_b), the last block of a group on its exact shape.
// This is how oneDNN reaches its brgemm-class kernels (AVX-512, AMX): its
// runtime-dimension primitives, which the per-group path uses, fall back to
// gemm:jit there (DESIGN.md §7). drhs keeps the per-group path (a block of
// rows would be a partial sum of dW).
//  * automatic (default): row blocks where they reach such a kernel, i.e.
//    with a weight version and where oneDNN packs b for the block's shape
//    (gemm_packs_weights); elsewhere (every f32 shape on AVX2, where
//    oneDNN 2.6 has gemm:jit only) the per-group path, with its bits.
//  * always: row blocks everywhere (tests and benchmarks of the task space
//    on machines where automatic never picks it).
//  * never: the per-group path.
// Bits: a row's result depends on the block it is computed in (gemm:jit's
// bits depend on m), so row blocks and the per-group path differ in the last
// bits, within the same f32 / bf16 bound; row blocks do not depend on the
// thread count (every block on one thread).
enum class RowBlocking { automatic, always, never };
// 64 rows: tasks small enough to spread one hot expert over the threads and
// few enough calls; oneDNN's bf16 AMX product of one expert ran at 2.8-3.0
// TFLOP/s at M = 32 and 64 against 3.27 at 256 (issue 29, 2 threads); not
// measured on such a machine with this code (none was reachable).
constexpr std::int64_t kRowBlockRows = 64;

struct GroupedGemmShape {
  std::span<const std::int64_t> group_sizes;  // G entries, each >= 0, summing to M
  std::int64_t k = 0;                         // inner size of the forward product
  std::int64_t n = 0;                         // output columns of the forward product
  ComputeDType compute_dtype = ComputeDType::f32;
  GroupSchedule schedule = GroupSchedule::balanced;
  // The weights' version (0 = unknown) and the opt-in packing, passed to
  // every group's gemm as b_version / pack_b (kernels/gemm.h) by forward and
  // dlhs, whose b is W_g: per version, W_g's bf16 copy is made once (same
  // bits), and with pack_weights its reorder into oneDNN's preferred layout.
  std::uint64_t weight_version = 0;
  bool pack_weights = false;
  RowBlocking row_blocking = RowBlocking::automatic;
};

// Per-group weight pointers: w_groups[g] is W_g ([k, n], row-major), and
// dw_groups[g] receives dW_g, so that the groups' matrices may live in
// different buffers (e.g. a rank's home experts and its replica slots)
// without a copy into one [G, k, n] array. Each span has exactly G non-null
// entries (InternalError otherwise). Same kernels and the same order as the
// contiguous form: the results are bit for bit those of the contiguous form
// given the same matrices.
void grouped_gemm_forward(const GroupedGemmShape& shape, const float* x, std::span<const float* const> w_groups,
                          float* out);
void grouped_gemm_dlhs(const GroupedGemmShape& shape, const float* dout, std::span<const float* const> w_groups,
                       float* dx, bool accumulate = false);
void grouped_gemm_drhs(const GroupedGemmShape& shape, const float* x, const float* dout,
                       std::span<float* const> dw_groups);

// Whether grouped_gemm_forward runs this shape as row blocks (RowBlocking),
// for callers that must give a group the forward's kernels and so its bits.
bool forward_uses_row_blocks(const GroupedGemmShape& shape);

// Several forward products of the same rows (the up projection's wi0 and
// wi1) in one task space, with an epilogue: each task, a group or a block of
// rows exactly as grouped_gemm_forward runs it (so every product keeps
// grouped_gemm_forward's bits), computes its rows of every product and then
// calls epilogue(first_row, rows) on the thread that ran it, while those
// rows are still in cache (the SwiGLU, kernels/swiglu_up_projection.h). A
// group the schedule runs on all threads calls its epilogue with the
// caller's whole budget; a group or block on one thread with a budget of
// one. Tasks without rows call nothing. A null epilogue: products only.
struct ForwardProduct {
  std::span<const float* const> w_groups;  // G matrices [k, n]
  float* out;                              // [M, n]
};
using ForwardEpilogue = std::function<void(std::int64_t first_row, std::int64_t rows)>;
void grouped_gemm_forward_tasks(const GroupedGemmShape& shape, const float* x, std::span<const ForwardProduct> products,
                                const ForwardEpilogue& epilogue);

// Contiguous form: W (and dW) is one [G, k, n] array, group g at g * k * n.
void grouped_gemm_forward(const GroupedGemmShape& shape, const float* x, const float* w, float* out);
// `accumulate` adds into dx (used to sum the two SwiGLU input branches).
void grouped_gemm_dlhs(const GroupedGemmShape& shape, const float* dout, const float* w, float* dx,
                       bool accumulate = false);
void grouped_gemm_drhs(const GroupedGemmShape& shape, const float* x, const float* dout, float* dw);

}  // namespace epmoe
