// Dense SwiGLU MLP: five GEMMs and the elementwise SwiGLU kernel.
#include "model/dense_swiglu.h"

#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/swiglu.h"

namespace epmoe {
namespace {

void check_matrix(const Tensor& t, std::int64_t rows, std::int64_t cols) {
  EPMOE_CHECK(t.dtype() == DType::f32);
  EPMOE_CHECK_EQ(t.rank(), 2);
  EPMOE_CHECK_EQ(t.dim(0), rows);
  EPMOE_CHECK_EQ(t.dim(1), cols);
}

struct Dims {
  std::int64_t num_tokens, hidden, ffn;
};

// The shapes both directions share: x [N, H], w0 and w1 [H, F], wo [F, H].
Dims check_operands(const Tensor& x, const Tensor& w0, const Tensor& w1, const Tensor& wo) {
  EPMOE_CHECK_EQ(w0.rank(), 2);
  const Dims d{x.rank() == 2 ? x.dim(0) : -1, w0.dim(0), w0.dim(1)};
  check_matrix(x, d.num_tokens, d.hidden);
  check_matrix(w0, d.hidden, d.ffn);
  check_matrix(w1, d.hidden, d.ffn);
  check_matrix(wo, d.ffn, d.hidden);
  return d;
}

void ensure_shape(Tensor& t, std::int64_t rows, std::int64_t cols) {
  if (t.dtype() != DType::f32 || t.shape() != Shape{rows, cols}) t = Tensor(DType::f32, {rows, cols});
}

}  // namespace

void dense_swiglu_forward(const Tensor& x, const Tensor& w0, const Tensor& w1, const Tensor& wo, Tensor& y,
                          DenseSwigluSaved& saved) {
  const auto [num_tokens, hidden, ffn] = check_operands(x, w0, w1, wo);
  check_matrix(y, num_tokens, hidden);
  ensure_shape(saved.h0, num_tokens, ffn);
  ensure_shape(saved.h1, num_tokens, ffn);
  ensure_shape(saved.act, num_tokens, ffn);
  if (num_tokens == 0) return;
  float* h0 = saved.h0.data<float>();
  float* h1 = saved.h1.data<float>();
  float* act = saved.act.data<float>();
  gemm({.a = x.data<float>(), .b = w0.data<float>(), .c = h0, .m = num_tokens, .n = ffn, .k = hidden});
  gemm({.a = x.data<float>(), .b = w1.data<float>(), .c = h1, .m = num_tokens, .n = ffn, .k = hidden});
  swiglu_forward(h0, h1, act, num_tokens * ffn);
  gemm({.a = act, .b = wo.data<float>(), .c = y.data<float>(), .m = num_tokens, .n = hidden, .k = ffn});
}

//   dact = dy wo^T            dwo = act^T dy
//   dh0, dh1 = swiglu'(h0, h1) dact
//   dw0 = x^T dh0             dw1 = x^T dh1
void dense_swiglu_backward_weights(const Tensor& x, const Tensor& w0, const Tensor& w1, const Tensor& wo,
                                   const DenseSwigluSaved& saved, const Tensor& dy, Tensor& dw0, Tensor& dw1,
                                   Tensor& dwo, DenseSwigluInputGrad& pending) {
  const auto [num_tokens, hidden, ffn] = check_operands(x, w0, w1, wo);
  check_matrix(saved.h0, num_tokens, ffn);
  check_matrix(saved.h1, num_tokens, ffn);
  check_matrix(saved.act, num_tokens, ffn);
  check_matrix(dy, num_tokens, hidden);
  check_matrix(dw0, hidden, ffn);
  check_matrix(dw1, hidden, ffn);
  check_matrix(dwo, ffn, hidden);
  // With no tokens the GEMMs below still zero the weight gradients (k = 0).
  Tensor dact(DType::f32, {num_tokens, ffn});
  pending.dh0 = Tensor(DType::f32, {num_tokens, ffn});
  pending.dh1 = Tensor(DType::f32, {num_tokens, ffn});
  const float* xp = x.data<float>();
  const float* dyp = dy.data<float>();
  gemm({.a = dyp,
        .b = wo.data<float>(),
        .c = dact.data<float>(),
        .m = num_tokens,
        .n = ffn,
        .k = hidden,
        .transpose_b = true});
  gemm({.a = saved.act.data<float>(),
        .b = dyp,
        .c = dwo.data<float>(),
        .m = ffn,
        .n = hidden,
        .k = num_tokens,
        .transpose_a = true});
  swiglu_backward(saved.h0.data<float>(), saved.h1.data<float>(), dact.data<float>(), pending.dh0.data<float>(),
                  pending.dh1.data<float>(), num_tokens * ffn);
  gemm({.a = xp,
        .b = pending.dh0.data<float>(),
        .c = dw0.data<float>(),
        .m = hidden,
        .n = ffn,
        .k = num_tokens,
        .transpose_a = true});
  gemm({.a = xp,
        .b = pending.dh1.data<float>(),
        .c = dw1.data<float>(),
        .m = hidden,
        .n = ffn,
        .k = num_tokens,
        .transpose_a = true});
}

//   dx += dh0 w0^T + dh1 w1^T
void dense_swiglu_backward_input(const Tensor& w0, const Tensor& w1, const DenseSwigluInputGrad& pending, Tensor& dx) {
  const std::int64_t num_tokens = pending.dh0.dim(0), ffn = pending.dh0.dim(1), hidden = w0.dim(0);
  check_matrix(pending.dh1, num_tokens, ffn);
  check_matrix(w0, hidden, ffn);
  check_matrix(w1, hidden, ffn);
  check_matrix(dx, num_tokens, hidden);
  gemm({.a = pending.dh0.data<float>(),
        .b = w0.data<float>(),
        .c = dx.data<float>(),
        .m = num_tokens,
        .n = hidden,
        .k = ffn,
        .transpose_b = true,
        .accumulate = true});
  gemm({.a = pending.dh1.data<float>(),
        .b = w1.data<float>(),
        .c = dx.data<float>(),
        .m = num_tokens,
        .n = hidden,
        .k = ffn,
        .transpose_b = true,
        .accumulate = true});
}

void dense_swiglu_backward(const Tensor& x, const Tensor& w0, const Tensor& w1, const Tensor& wo,
                           const DenseSwigluSaved& saved, const Tensor& dy, Tensor& dx, Tensor& dw0, Tensor& dw1,
                           Tensor& dwo) {
  const auto dims = check_operands(x, w0, w1, wo);
  check_matrix(dx, dims.num_tokens, dims.hidden);
  DenseSwigluInputGrad pending;
  dense_swiglu_backward_weights(x, w0, w1, wo, saved, dy, dw0, dw1, dwo, pending);
  dense_swiglu_backward_input(w0, w1, pending, dx);
}

}  // namespace epmoe
