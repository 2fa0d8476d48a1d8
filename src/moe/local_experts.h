// The experts of one rank, applied to the rows a dispatcher delivered
// (ep::ExpertRows): grouped GEMMs + SwiGLU per local expert, each row's
// output weighted by its routing weight and summed into its slot.
//   forward:  slot_out[s] = sum over rows r of slot s of w_r * expert_{e(r)}(x_r)
//   backward: from d(slot_out) to d(slot input) (summed per slot), d(w_r)
//             per row, and the local experts' weight gradients.
// Rows of a slot are summed in ascending row order: deterministic.
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory_ledger.h"
#include "core/tensor.h"
#include "ep/expert_rows.h"
#include "kernels/compute_dtype.h"

namespace epmoe {

// Views of the local experts' weights (not owned), one matrix per group of
// the rows (ep::ExpertRows::group_sizes: the E_l home experts, then any
// replica slots). Either contiguous, `{wi0, wi1, wo}` as base pointers of
// [G, H, F] / [G, F, H] arrays, or per group: a non-empty wi0_groups (G
// entries, each an [H, F] matrix) overrides wi0, and likewise for wi1 and wo,
// so that homes and replica slots may live in different buffers without a
// copy. Both forms give the same bits for the same matrices.
struct LocalExpertWeights {
  const float* wi0 = nullptr;                 // [G, H, F]
  const float* wi1 = nullptr;                 // [G, H, F]
  const float* wo = nullptr;                  // [G, F, H]
  std::vector<const float*> wi0_groups = {};  // [G] of [H, F], or empty: use wi0
  std::vector<const float*> wi1_groups = {};  // [G] of [H, F], or empty: use wi1
  std::vector<const float*> wo_groups = {};   // [G] of [F, H], or empty: use wo
  // Identifies the values behind the pointers: equal non-zero versions with
  // equal pointers promise equal values (a cache of derived forms may rely
  // on it); 0 = unknown, nothing is reused.
  std::uint64_t version = 0;
};

// Where experts_backward writes (or, with accumulate, adds) each group's
// weight gradient: G non-null pointers per matrix, dwi0[g] and dwi1[g] to
// [H, F], dwo[g] to [F, H]; the matrices may live in different buffers.
struct ExpertWeightGradients {
  std::vector<float*> dwi0, dwi1, dwo;
};

// The expert activations the backward needs (DESIGN.md §4.7 names):
// mlpwi_0 = x wi0, mlpwi_1 = x wi1 [rows, F]; mlpwo = the expert outputs
// before weighting [rows, H].
struct ExpertActivations {
  Tensor mlpwi_0, mlpwi_1, mlpwo;
};

struct ExpertGradients {
  Tensor slot_dx;                   // [num_slots, H]
  std::vector<float> row_dweights;  // [num_rows]
};

struct ExpertShape {
  std::int64_t hidden = 0, ffn = 0;
  ComputeDType compute_dtype = ComputeDType::f32;
  // Opt-in: with a weight version, keep each expert matrix reordered into
  // oneDNN's preferred layout (GemmArgs::pack_b: the same bits where that
  // layout is plain, as on AVX2; otherwise within the f32/bf16 bound).
  bool pack_weights = false;
  // Opt-in: with a weight version, mlpwi_0 and mlpwi_1 come from one
  // product with [wi0 | wi1] and the SwiGLU runs on it while in cache
  // (kernels/swiglu_up_projection.h), into the same [rows, F] tensors. Used
  // when both are to be computed (the forward, or a recompute of both); one
  // alone takes its own product. Off by default: the kernel keeps the two
  // products' bits in every test and layer run, yet `epmoe train` (H = 128,
  // F = 256) lost them in the last bits of the loss (2026-12-01, not yet
  // explained), and it measured 1.02-1.07x the unfused layer's time on the
  // AVX2 EPYC (docs/BENCHMARKS.md, issue 15 (e)).
  bool fuse_up_projection = false;
};

// Bytes the kernels keep for these weights across calls (bf16 copies and
// layouts packed per weight version, kernels/gemm.h) for `num_groups`
// groups: what the layer charges to its ledger.
std::int64_t prepared_weight_bytes(const ExpertShape& shape, std::size_t num_groups, const LocalExpertWeights& weights);

// Returns the slot outputs [num_slots, H] and the activations in `saved`.
Tensor experts_forward(const ExpertShape& shape, const ep::ExpertRows& rows, const LocalExpertWeights& weights,
                       ExpertActivations& saved);

// Recomputes the activations that are empty in `activations` (dropped after
// the forward by the remat policy) with the forward's own kernels, so they
// come out bit for bit the same. Returns the bytes recomputed.
std::int64_t recompute_activations(const ExpertShape& shape, const ep::ExpertRows& rows,
                                   const LocalExpertWeights& weights, ExpertActivations& activations);

// Writes the local experts' weight gradients to the per-group pointers of
// `dw`, or adds them there with `accumulate` (chunks after the first).
// InternalError when a pointer list does not have one non-null entry per group.
ExpertGradients experts_backward(const ExpertShape& shape, const ep::ExpertRows& rows,
                                 const LocalExpertWeights& weights, const ExpertActivations& saved,
                                 const Tensor& slot_dy, const ExpertWeightGradients& dw, bool accumulate);

// The same into contiguous [G, H, F] / [G, F, H] arrays (bit for bit the
// per-group form's results).
ExpertGradients experts_backward(const ExpertShape& shape, const ep::ExpertRows& rows,
                                 const LocalExpertWeights& weights, const ExpertActivations& saved,
                                 const Tensor& slot_dy, MutableTensorView dwi0, MutableTensorView dwi1,
                                 MutableTensorView dwo, bool accumulate);

}  // namespace epmoe
