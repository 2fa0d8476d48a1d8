// A dense SwiGLU MLP applied to every token: the optional "shared expert" of
// DeepSeek-style MoE blocks, which runs beside the routed experts.
//   h0 = x w0, h1 = x w1 ([N, F]), act = silu(h0) * h1, y = act wo ([N, H])
// with w0, w1 [H, F] and wo [F, H] (the expert layout of DESIGN.md §1 for one
// expert). fp32 GEMMs on oneDNN (kernels/gemm.h).
#pragma once

#include "core/tensor.h"

namespace epmoe {

// The activations backward needs, each [N, F] f32. Kept by the caller between
// forward and backward; forward reuses the tensors when their shape already
// fits (a training loop allocates them once).
struct DenseSwigluSaved {
  Tensor h0, h1, act;
};

// x [N, H]; y [N, H] preallocated and OVERWRITTEN. N may be 0.
void dense_swiglu_forward(const Tensor& x, const Tensor& w0, const Tensor& w1, const Tensor& wo,
                          Tensor& y, DenseSwigluSaved& saved);

// dy [N, H]. dx [N, H] is ADDED TO (the MLP sits beside other branches on the
// residual stream); dw0, dw1 [H, F] and dwo [F, H] are OVERWRITTEN (zero for
// N = 0).
void dense_swiglu_backward(const Tensor& x, const Tensor& w0, const Tensor& w1, const Tensor& wo,
                           const DenseSwigluSaved& saved, const Tensor& dy, Tensor& dx, Tensor& dw0,
                           Tensor& dw1, Tensor& dwo);

}  // namespace epmoe
