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

// Views of the local experts' weights (not owned).
struct LocalExpertWeights {
  const float* wi0 = nullptr;  // [E_l, H, F]
  const float* wi1 = nullptr;  // [E_l, H, F]
  const float* wo = nullptr;   // [E_l, F, H]
};

// The expert activations the backward needs (DESIGN.md §4.7 names):
// mlpwi_0 = x wi0, mlpwi_1 = x wi1 [rows, F]; mlpwo = the expert outputs
// before weighting [rows, H].
struct ExpertActivations {
  Tensor mlpwi_0, mlpwi_1, mlpwo;
};

struct ExpertGradients {
  Tensor slot_dx;                  // [num_slots, H]
  std::vector<float> row_dweights; // [num_rows]
};

struct ExpertShape {
  std::int64_t hidden = 0, ffn = 0;
  ComputeDType compute_dtype = ComputeDType::f32;
};

// Returns the slot outputs [num_slots, H] and the activations in `saved`.
Tensor experts_forward(const ExpertShape& shape, const ep::ExpertRows& rows,
                       const LocalExpertWeights& weights, ExpertActivations& saved);

// Recomputes the activations that are empty in `activations` (dropped after
// the forward by the remat policy) with the forward's own kernels, so they
// come out bit for bit the same. Returns the bytes recomputed.
std::int64_t recompute_activations(const ExpertShape& shape, const ep::ExpertRows& rows,
                                   const LocalExpertWeights& weights, ExpertActivations& activations);

// Writes the local experts' weight gradients into dwi0, dwi1, dwo, or adds
// them there with `accumulate` (chunks after the first).
ExpertGradients experts_backward(const ExpertShape& shape, const ep::ExpertRows& rows,
                                 const LocalExpertWeights& weights, const ExpertActivations& saved,
                                 const Tensor& slot_dy, Tensor& dwi0, Tensor& dwi1, Tensor& dwo,
                                 bool accumulate);

}  // namespace epmoe
