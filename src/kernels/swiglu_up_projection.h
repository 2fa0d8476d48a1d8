// The experts' up projection and SwiGLU in one pass over each group:
//   h0 = x_g wi0_g, h1 = x_g wi1_g  [rows_g, f],  act = silu(h0) * h1
// computed, for a group that runs on one thread, as one product of x_g with
// [wi0_g | wi1_g] [k, 2f] (kernels/concatenated_weights.h, built once per
// weight version) into a per-thread scratch whose rows are split into h0
// and h1 and fed to the SwiGLU a few rows at a time, while in cache. x_g is
// read once instead of twice and the SwiGLU needs no pass of its own.
//
// Bits: the same as grouped_gemm_forward with wi0, then with wi1, then
// swiglu_forward. What that takes, measured with oneDNN 2.6's f32 matmul
// (gemm:jit) on this machine (2026-12-01, AMD EPYC, AVX2):
//  * on one thread an element's bits depend on n only through the kernels
//    that cover a product's last columns, so on the width f alone: for k in
//    {15, 16, 17, 64, 256, 1024} both halves kept their bits at f = 2, 4,
//    16, 32, 64, 512 and not at f = 7, 8, 9, 20. So each (k, f, dtype) is
//    probed once per process (seeded data, both ways, both halves); where
//    the bits differ nothing is fused;
//  * they do depend on the thread count, and on two threads on n at more
//    shapes (9 of 48 with f in {9, 64, 512}), so a group the schedule
//    (kernels/group_schedule.h) runs on all threads keeps its two products
//    of f columns; only a group that runs on one thread is fused;
//  * they depend on m (a 300-row product vs the same rows in tiles of 64
//    or 16 differed at all 12 shapes tried), so the product covers the
//    whole group: the SwiGLU consumes the group's result in blocks of rows
//    as they are copied out of the scratch, not row tiles of the product.
// With compute_dtype=bf16 the probe decides as well (the operands convert
// elementwise; this CPU has no bf16 kernels to measure).
// Not fused, for the same bits: weight_version 0 (nothing to key the
// concatenation on: it would be a copy per call), pack_weights (the packed
// layout oneDNN picks depends on n), a forward that runs as row blocks
// (kernels/grouped_gemm.h: its products cover blocks, not whole groups) and f32 on EPMOE_F32_GEMM=openblas
// (OpenBLAS 0.3.21's bits depend on n and m on one thread: 17 of 48 shapes).
#pragma once

#include <cstdint>
#include <span>

#include "kernels/grouped_gemm.h"

namespace epmoe {

// How the two products are formed:
//  * concatenated (where the bits allow, see above): one product with
//    [wi0 | wi1] for each group that runs on one thread; opt-in
//    (MoeLayerConfig::fuse_up_projection), measured slower;
//  * two_products: the forward's task space (grouped_gemm_forward_tasks)
//    with both products in each task and the SwiGLU of the task's rows as
//    its epilogue, while they are in cache, instead of a pass over all rows
//    afterwards; the default of the MoE layer. Bits: those of
//    grouped_gemm_forward twice and swiglu_forward (every product is the
//    forward's, the SwiGLU elementwise).
enum class UpProjection { concatenated, two_products };

// shape.n is f, shape.k the inner size; wi0_groups[g] and wi1_groups[g] are
// group g's [k, f] matrices. Writes h0 and h1 [M, f] and, unless act is
// null, act [M, f]. InternalError for a wrong pointer count or a null one.
// Scratch (concatenated): up to a thread's share of the rows times 2f floats
// per thread, kept between calls (new pages cost ~11 us each, DESIGN.md §7).
void grouped_swiglu_up_projection(const GroupedGemmShape& shape, const float* x,
                                  std::span<const float* const> wi0_groups, std::span<const float* const> wi1_groups,
                                  float* h0, float* h1, float* act, UpProjection how);

// Whether one-thread groups of this (k, f, dtype) take the concatenated
// product: its halves carry the two products' bits, probed once per process
// on seeded data (m = 5 and 40), cached.
bool fused_up_projection_keeps_bits(std::int64_t k, std::int64_t f, ComputeDType dtype);

}  // namespace epmoe
