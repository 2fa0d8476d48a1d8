// bf16 tokens (fp8_tokens=bf16): what the accelerators' systems send when
// they compute in bf16, the baseline fp8's gain is read against. R = 1 and 3
// ranks as threads, both dispatchers. The experts see x rounded to bf16;
// the router sees x; gradients travel in fp32.
//  1. Exact emulation: the layer equals the double reference whose experts
//     see bf16(x) (kernels/convert.h's rounding) within 1e-5.
//  2. Derived bound (docs/NUMERICS.md): round to nearest even keeps 8
//     significant bits, so |bf16(v) - v| <= 2^-8·|v| (bf16 has f32's exponent
//     range: no saturation, and its subnormal step 2^-133 is below the float
//     slack 2^-20·|v| of any value the problem holds); propagated by the
//     BoundedValue reference, |got - exact| <= bound + 1e-5·max|exact|.
//  3. Bytes: a bf16 token row is half an f32 row and twice an fp8 one.
// Topology: ranks as threads over the threads transport (run_ep_layer), one
// compute thread per rank; R in {1, 3} (bytes: R = 4).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "ep/token_codec.h"
#include "ep_harness.h"
#include "expect_reference.h"
#include "kernels/convert.h"

namespace epmoe {
namespace {

using testing::EpRunOptions;
using testing::ids_of;
using testing::MoeProblem;

TEST(Bf16Tokens, MatchesEmulationAndStaysWithinDerivedBound) {
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 12, .top_k = 3};
  const MoeProblem p = testing::make_problem(24, 16, 12, router, 33);
  const std::int64_t n = p.x.dim(0), h = p.x.dim(1);
  Tensor rounded(DType::f32, {n, h});
  std::vector<double> error_bound(static_cast<std::size_t>(n * h));
  double max_token_error = 0;
  for (std::int64_t i = 0; i < n * h; ++i) {
    const float v = p.x.data<float>()[i];
    rounded.data<float>()[i] = bf16_to_float(float_to_bf16(v));
    error_bound[i] = std::ldexp(std::abs(double(v)), -8) + std::ldexp(std::abs(double(v)), -20);
    const double err = std::abs(double(rounded.data<float>()[i]) - v);
    max_token_error = std::max(max_token_error, err);
    ASSERT_LE(err, error_bound[i]) << "token element " << i;
  }
  ASSERT_GT(max_token_error, 1e-4);  // the round trip really loses precision (else the test is empty)
  for (int num_ranks : {1, 3}) {
    for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
      EpRunOptions options{.num_ranks = num_ranks, .dispatch = dispatch};
      options.ep.token_format = TokenFormat::bf16;
      const testing::EpRunResult run = testing::run_ep_layer(p, options);
      const auto ids = ids_of(run.topk_ids);
      const std::string what = "bf16 R" + std::to_string(num_ranks) + " " + to_string(dispatch);
      // Exact emulation: the experts see the decoded tokens.
      testing::expect_matches_reference(run, testing::reference_moe_with_expert_input(p, ids, rounded), what);
      testing::expect_within_bounds(run, testing::reference_moe_with_lossy_tokens(p, ids, error_bound), what);
    }
  }
}

TEST(Bf16Tokens, HalveTheF32TokenBytesAndDoubleFp8s) {
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 8, .top_k = 2};
  const MoeProblem p = testing::make_problem(16, 32, 8, router, 34);
  for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    const std::string name =
        dispatch == DispatchKind::ring ? "forward/ring_all_gather tokens" : "forward/all_to_all_v tokens";
    std::map<TokenFormat, std::int64_t> bytes;
    for (TokenFormat format : {TokenFormat::f32, TokenFormat::bf16, TokenFormat::fp8_tensor}) {
      EpRunOptions options{.num_ranks = 4, .dispatch = dispatch};
      options.ep.token_format = format;
      bytes[format] = testing::run_ep_layer(p, options).stats[0].bytes_sent.at(name);
    }
    EXPECT_GT(bytes[TokenFormat::f32], 0) << name;
    EXPECT_EQ(bytes[TokenFormat::bf16] * 2, bytes[TokenFormat::f32]) << name;
    EXPECT_EQ(bytes[TokenFormat::fp8_tensor] * 2, bytes[TokenFormat::bf16]) << name;
  }
}

}  // namespace
}  // namespace epmoe
