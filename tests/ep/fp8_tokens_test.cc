// fp8 e4m3 tokens (fp8_tokens=tensor|token), R = 1, 3 and 4 ranks as threads,
// both dispatchers. The experts see x after an fp8 round trip; the router
// sees x; gradients travel in fp32 and flow straight through to x.
//  1. Exact emulation: the layer equals the double reference whose experts
//     see decode(encode(x)) (computed with the same codec) within 1e-5.
//  2. Derived bound: each token element's error is at most
//     2^-4·|x| + 2^-10·s (+ float slack), s = the scale (absmax / 448 of
//     the tensor or of the token); propagated by the BoundedValue reference
//     to every output, |got - exact| <= bound + 1e-5·max|exact|.
//  3. Non-finite tokens are refused (never encoded): by encode in both
//     formats, by the per-tensor scale agreement on every rank (3 ranks as
//     threads, one holding the bad value), and by the layer before dispatch.
// Topology: ranks as threads over the threads transport (run_ep_layer), one
// compute thread per rank; R in {1, 3, 4} (the scale agreement: run_ranks, R =
// 3, cores / R compute threads each).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <mutex>

#include "core/error.h"
#include "ep/token_codec.h"
#include "ep_harness.h"
#include "expect_reference.h"
#include "transport/threads/launcher.h"

namespace epmoe {
namespace {

using testing::EpRunOptions;
using testing::ids_of;
using testing::MoeProblem;

struct Roundtrip {
  Tensor dequantized;
  std::vector<double> error_bound;
};

Roundtrip fp8_roundtrip(const Tensor& x, TokenFormat format) {
  const std::int64_t n = x.dim(0), h = x.dim(1);
  const ep::TokenCodec codec(format, h);
  const float tensor_scale = ep::fp8_scale_for(ep::absmax(x.data<float>(), x.numel()));
  std::vector<std::byte> wire(static_cast<std::size_t>(n * codec.row_bytes()));
  Roundtrip out{Tensor(DType::f32, {n, h}), std::vector<double>(static_cast<std::size_t>(n * h))};
  codec.encode(x.data<float>(), nullptr, n, tensor_scale, wire.data());
  codec.decode(wire.data(), n, tensor_scale, out.dequantized.data<float>());
  for (std::int64_t t = 0; t < n; ++t) {
    const double scale =
        format == TokenFormat::fp8_token ? ep::fp8_scale_for(ep::absmax(x.data<float>() + t * h, h)) : tensor_scale;
    for (std::int64_t j = 0; j < h; ++j) {
      const double v = std::abs(x.data<float>()[t * h + j]);
      out.error_bound[t * h + j] = std::ldexp(v, -4) + std::ldexp(scale, -10) + std::ldexp(v, -20);
    }
  }
  return out;
}

TEST(Fp8Tokens, MatchesEmulationAndStaysWithinDerivedBound) {
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 12, .top_k = 3};
  const MoeProblem p = testing::make_problem(24, 16, 12, router, 31);
  for (TokenFormat format : {TokenFormat::fp8_tensor, TokenFormat::fp8_token}) {
    const Roundtrip trip = fp8_roundtrip(p.x, format);
    // The token round trip really loses precision (else the test is empty).
    double max_token_error = 0;
    for (std::int64_t i = 0; i < p.x.numel(); ++i) {
      const double err = std::abs(double(trip.dequantized.data<float>()[i]) - p.x.data<float>()[i]);
      max_token_error = std::max(max_token_error, err);
      ASSERT_LE(err, trip.error_bound[i]) << "token element " << i;
    }
    ASSERT_GT(max_token_error, 1e-3);
    for (int num_ranks : {1, 3, 4}) {
      for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
        EpRunOptions options{.num_ranks = num_ranks, .dispatch = dispatch};
        options.ep.token_format = format;
        const testing::EpRunResult run = testing::run_ep_layer(p, options);
        const auto ids = ids_of(run.topk_ids);
        const std::string what = to_string(format) + " R" + std::to_string(num_ranks) + " " + to_string(dispatch);
        // Exact emulation: the experts see the decoded tokens.
        testing::expect_matches_reference(run, testing::reference_moe_with_expert_input(p, ids, trip.dequantized),
                                          what);
        testing::expect_within_bounds(run, testing::reference_moe_with_lossy_tokens(p, ids, trip.error_bound), what);
      }
    }
  }
}

TEST(Fp8Tokens, HalvesOrQuartersTheTokenBytes) {
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 8, .top_k = 2};
  const MoeProblem p = testing::make_problem(16, 32, 8, router, 32);
  std::map<TokenFormat, std::int64_t> bytes;
  for (TokenFormat format : {TokenFormat::f32, TokenFormat::fp8_tensor, TokenFormat::fp8_token}) {
    EpRunOptions options{.num_ranks = 4, .dispatch = DispatchKind::ring};
    options.ep.token_format = format;
    bytes[format] = testing::run_ep_layer(p, options).stats[0].bytes_sent.at("forward/ring_all_gather tokens");
  }
  EXPECT_EQ(bytes[TokenFormat::fp8_tensor] * 4, bytes[TokenFormat::f32]);
  // Per-token scales: 4 more bytes per row of H = 32.
  EXPECT_EQ(bytes[TokenFormat::fp8_token], bytes[TokenFormat::fp8_tensor] * (32 + 4) / 32);
}

const float kBadValues[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
const char* const kBadNames[] = {"nan", "inf", "-inf"};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const NumericError& e) {
    return e.what();
  }
  return "";
}

// Before the fix, one inf made absmax inf, scale inf and every decoded value
// NaN (per tensor: the whole chunk; per token: the row). Now encode refuses
// it, naming the format, the row and the element, for NaN, +inf and -inf at
// the first and the last element.
TEST(Fp8Tokens, EncodeRefusesNonFiniteValuesByRowAndElement) {
  const std::int64_t n = 5, h = 16;
  Tensor x(DType::f32, {n, h});
  for (std::int64_t i = 0; i < n * h; ++i) x.data<float>()[i] = 0.25f * float(i % 7) - 0.5f;
  const float finite_scale = ep::fp8_scale_for(ep::absmax(x.data<float>(), x.numel()));
  for (TokenFormat format : {TokenFormat::fp8_tensor, TokenFormat::fp8_token}) {
    const ep::TokenCodec codec(format, h);
    std::vector<std::byte> wire(static_cast<std::size_t>(n * codec.row_bytes()));
    for (int b = 0; b < 3; ++b) {
      for (std::int64_t flat : {std::int64_t{0}, 3 * h + 7, n * h - 1}) {
        const float saved = x.data<float>()[flat];
        x.data<float>()[flat] = kBadValues[b];
        const std::string expected = "fp8_tokens=" + to_string(format) + ": token row " + std::to_string(flat / h) +
                                     " holds " + kBadNames[b] + " at element " + std::to_string(flat % h) +
                                     ": fp8 e4m3 tokens must be finite";
        EXPECT_EQ(error_of([&] { codec.encode(x.data<float>(), nullptr, n, finite_scale, wire.data()); }), expected);
        // Through a row index (the all-to-all's gather), the message names
        // the source row.
        const std::vector<std::int64_t> order = {4, 3, 2, 1, 0};
        EXPECT_EQ(error_of([&] { codec.encode(x.data<float>(), order.data(), n, finite_scale, wire.data()); }),
                  expected);
        // absmax never drops a NaN, and no scale comes from a non-finite max.
        EXPECT_EQ(ep::absmax(x.data<float>(), x.numel()), std::numeric_limits<float>::infinity());
        EXPECT_NE(error_of([&] {
                    ep::fp8_scale_for(ep::absmax(x.data<float>(), x.numel()));
                  }).find("fp8 token scale: the absmax is inf, so no finite scale exists"),
                  std::string::npos);
        x.data<float>()[flat] = saved;
      }
    }
    // Finite rows still encode: the check refuses nothing else.
    EXPECT_NO_THROW(codec.encode(x.data<float>(), nullptr, n, finite_scale, wire.data()));
  }
}

// fp8_tokens=tensor over 3 ranks as threads: rank 1 holds the bad value; every
// rank throws NumericError naming rank 1 (none waits for a scale that never
// comes, none gets scale inf).
TEST(Fp8Tokens, TensorScaleAgreementFailsOnEveryRank) {
  const int num_ranks = 3;
  const std::int64_t n = 4, h = 8;
  for (int b = 0; b < 3; ++b) {
    std::vector<std::string> messages(num_ranks);
    std::mutex mutex;
    transport::threads::run_ranks(num_ranks, {}, [&](transport::Communicator& comm) {
      std::vector<float> rows(static_cast<std::size_t>(n * h), 1.0f + comm.rank());
      if (comm.rank() == 1) rows[static_cast<std::size_t>(n * h - 1)] = kBadValues[b];
      const std::string message = error_of(
          [&] { ep::agree_on_tensor_scale(comm, rows.data(), n * h, /*tag=*/7, std::chrono::milliseconds(20000)); });
      std::lock_guard<std::mutex> lock(mutex);
      messages[comm.rank()] = message;
    });
    for (int r = 0; r < num_ranks; ++r) {
      std::string expected =
          "fp8_tokens=tensor: rank 1's tokens hold a non-finite value, so no finite per-tensor scale exists";
      if (r == 1) expected += " (value 31 of this rank's chunk = " + std::string(kBadNames[b]) + ")";
      EXPECT_EQ(messages[r], expected + "; fp8 e4m3 tokens must be finite") << "rank " << r;
    }
  }
}

// The layer refuses the bad token before any dispatch: a run with an inf in
// rank 1's x fails with that rank's NumericError, not with NaN outputs.
TEST(Fp8Tokens, LayerRefusesNonFiniteTokensBeforeDispatch) {
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 6, .top_k = 2};
  MoeProblem p = testing::make_problem(9, 8, 8, router, 33);
  // 3 ranks hold 3 tokens each: token 4 is rank 1's row 1.
  p.x.data<float>()[4 * 8 + 5] = std::numeric_limits<float>::infinity();
  for (TokenFormat format : {TokenFormat::fp8_tensor, TokenFormat::fp8_token}) {
    for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
      EpRunOptions options{.num_ranks = 3, .dispatch = dispatch};
      options.ep.token_format = format;
      EXPECT_NE(error_of([&] { testing::run_ep_layer(p, options); }).find("x[1, 5] = inf: inputs must be finite"),
                std::string::npos)
          << to_string(format) << " " << to_string(dispatch);
    }
  }
}

}  // namespace
}  // namespace epmoe
