// A plain double-precision MoE layer: a loop over tokens and their K experts,
// the definition every optimised path is held to (DESIGN.md §3). Forward and
// hand-derived backward; no kernels, no permutation, no threads.
#pragma once

#include <cstdint>
#include <vector>

#include "bounded_value.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "moe/router.h"

namespace epmoe::testing {

struct MoeProblem {
  std::int64_t num_tokens = 0, hidden = 0, ffn = 0;
  RouterConfig router;
  Tensor x, gate, wi0, wi1, wo, bias, dy;  // f32, bias [E] (zeros unless set)
};

// Random problem with O(1) activations: x, dy ~ N(0, 1), weights ~ N(0, 1/fan_in),
// bias ~ N(0, bias_scale) (selection-only; 0 leaves it zero).
MoeProblem make_problem(std::int64_t num_tokens, std::int64_t hidden, std::int64_t ffn, RouterConfig router,
                        std::uint64_t seed, double bias_scale = 0.0);

template <typename T>
struct BasicReferenceResult {
  std::vector<std::int32_t> topk_ids;  // [N, K], as chosen in double
  std::vector<T> topk_weights;         // [N, K]
  std::vector<T> y;                    // [N, H]
  std::vector<T> dx, dgate, dwi0, dwi1, dwo;
};
using ReferenceResult = BasicReferenceResult<double>;
using BoundedReferenceResult = BasicReferenceResult<BoundedValue>;

// Routing and forward in double; when `ids` is non-empty those expert ids are
// used instead of the double-precision choice (so a near-tie that float and
// double order differently cannot make the comparison meaningless; the test
// checks the choices agree separately). For the random router `logits` must
// be given (the layer's draw). Backward uses problem.dy.
ReferenceResult reference_moe(const MoeProblem& problem, const std::vector<std::int32_t>& ids = {},
                              const Tensor* logits = nullptr);

// The reference when some (token, k) pairs were dropped by a capacity limit:
// dropped[t * K + k] pairs add nothing to y and get a zero weight gradient
// (the routing weights themselves are unchanged).
ReferenceResult reference_moe_with_drops(const MoeProblem& problem, const std::vector<std::int32_t>& ids,
                                         const std::vector<bool>& dropped);

// The same loop carrying first-order error bounds (bounded_value.h) for an
// implementation whose expert-GEMM operands are rounded with unit roundoff
// `operand_roundoff` (bf16: 2^-8) and whose router runs in fp32.
BoundedReferenceResult reference_moe_bounded(const MoeProblem& problem, double operand_roundoff,
                                             const std::vector<std::int32_t>& ids = {}, const Tensor* logits = nullptr);

// The experts see `expert_x` [N, H] instead of x (e.g. tokens after an fp8
// round trip); the router still sees x, and dx flows to x unchanged (the
// straight-through gradient of a transfer format).
ReferenceResult reference_moe_with_expert_input(const MoeProblem& problem, const std::vector<std::int32_t>& ids,
                                                const Tensor& expert_x);
// The same with bounds: the experts see x with |error| <= token_error_bound
// per element; everything else exact (fp32 compute).
BoundedReferenceResult reference_moe_with_lossy_tokens(const MoeProblem& problem, const std::vector<std::int32_t>& ids,
                                                       const std::vector<double>& token_error_bound);

// The double loop with every expert-GEMM operand rounded to bf16 as the bf16
// path does: what that path computes, up to fp32 accumulation order.
ReferenceResult reference_moe_bf16_emulated(const MoeProblem& problem, const std::vector<std::int32_t>& ids);

// Per element of y and of dx's expert part, the sum over the token's K pairs
// of |that pair's contribution| (y: |w_k · expert_k(x)|; dx: |w_k · J_k^T dy|),
// in double: a bound on every partial sum of the contributions, whichever
// ranks hold which pairs (the derived bound of a bf16 wire, NUMERICS.md).
struct ContributionMagnitudes {
  std::vector<double> y, dx;  // [N, H]
};
ContributionMagnitudes reference_contribution_magnitudes(const MoeProblem& problem,
                                                         const std::vector<std::int32_t>& ids);

// max|got - ref| / max|ref| (0 when both are all zero).
double relative_error(const Tensor& got, const std::vector<double>& ref);

// The same shape and the same bytes: two runs that must agree bit for bit.
bool same_bits(const Tensor& a, const Tensor& b);

// An f32 tensor's values in double, to compare with a reference.
std::vector<double> as_double(const Tensor& t);

// Loss sum(dy * y) in double for the given problem (used by finite differences).
double reference_loss(const MoeProblem& problem);

}  // namespace epmoe::testing
