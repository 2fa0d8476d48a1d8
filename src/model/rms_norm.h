// RMSNorm over the hidden dimension of a token batch (the pre-norm of every
// block and the final norm of the tiny LM, DESIGN.md §4.9):
//   inv_rms[n] = 1 / sqrt(mean_j x[n, j]^2 + eps),  y[n, j] = x[n, j] inv_rms[n] scale[j].
// inv_rms is returned so that backward does not recompute it.
// Results are bit-identical for every compute-thread budget: every sum has an
// order fixed by the shapes alone (rows are reduced one by one, dscale column
// by column over rows in order), so runs are reproducible whatever the split.
#pragma once

#include "core/tensor.h"

namespace epmoe {

// x [N, H] f32 (H >= 1), scale [H] f32, eps > 0; y [N, H] and inv_rms [N]
// f32 are preallocated by the caller and OVERWRITTEN. N may be 0.
void rms_norm_forward(const Tensor& x, const Tensor& scale, float eps, Tensor& y, Tensor& inv_rms);

// dy [N, H]. dx [N, H] is ADDED TO (the norm sits on a residual stream whose
// gradient already holds the skip path); dscale [H] is OVERWRITTEN.
void rms_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& inv_rms, const Tensor& dy, Tensor& dx,
                       Tensor& dscale);

}  // namespace epmoe
