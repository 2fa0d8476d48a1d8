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
void dense_swiglu_forward(const Tensor& x, const Tensor& w0, const Tensor& w1, const Tensor& wo, Tensor& y,
                          DenseSwigluSaved& saved);

// dy [N, H]. dx [N, H] is ADDED TO (the MLP sits beside other branches on the
// residual stream); dw0, dw1 [H, F] and dwo [F, H] are OVERWRITTEN (zero for
// N = 0).
void dense_swiglu_backward(const Tensor& x, const Tensor& w0, const Tensor& w1, const Tensor& wo,
                           const DenseSwigluSaved& saved, const Tensor& dy, Tensor& dx, Tensor& dw0, Tensor& dw1,
                           Tensor& dwo);

// The backward in two parts, for a caller that overlaps the weight part with
// other work (the routed experts' exchanges, model/moe_lm.cc) and has the
// other branch's dx only afterwards: dense_swiglu_backward is
// backward_weights then backward_input, the same bits.
struct DenseSwigluInputGrad {
  Tensor dh0, dh1;  // [N, F]
};
// dw0, dw1, dwo OVERWRITTEN; `pending` receives what backward_input needs.
void dense_swiglu_backward_weights(const Tensor& x, const Tensor& w0, const Tensor& w1, const Tensor& wo,
                                   const DenseSwigluSaved& saved, const Tensor& dy, Tensor& dw0, Tensor& dw1,
                                   Tensor& dwo, DenseSwigluInputGrad& pending);
// dx [N, H] ADDED TO: dx += dh0 w0^T, then dx += dh1 w1^T.
void dense_swiglu_backward_input(const Tensor& w0, const Tensor& w1, const DenseSwigluInputGrad& pending, Tensor& dx);

}  // namespace epmoe
