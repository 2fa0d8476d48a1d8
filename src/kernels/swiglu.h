// SwiGLU activation of an expert: act = silu(h0) * h1, silu(z) = z * sigmoid(z),
// where h0 = x wi0 and h1 = x wi1. Elementwise over n values.
#pragma once

#include <cstdint>

namespace epmoe {

void swiglu_forward(const float* h0, const float* h1, float* act, std::int64_t n);

// From d(act): dh0 = dact * h1 * silu'(h0), dh1 = dact * silu(h0). With a
// non-null `act`, also the forward's activation, bit for bit swiglu_forward's
// (the same operations on the same sigmoid): a backward that must rebuild
// it (the experts' weight gradient of wo) gets it from this pass instead of
// another pass over h0 and h1.
void swiglu_backward(const float* h0, const float* h1, const float* dact, float* dh0, float* dh1, std::int64_t n,
                     float* act = nullptr);

}  // namespace epmoe
