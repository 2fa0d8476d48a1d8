// wire_dtype=bf16: combine outputs, cotangents (dy rows) and dx travel as
// bf16, the way the accelerators' systems that compute in bf16 send them.
// Tokens stay f32 here (EpConfig keeps the two apart) and dy is chosen
// bf16-representable, so the only roundings are the combine's and dx's
// (dy's all-gather and all-to-all then carry it exactly):
//  1. Bytes: the combine, cotangent and dx streams carry half the bytes of an
//     f32 wire on both dispatchers; the routing-weight gradients do not
//     change (they travel in f32). transport_bytes_test holds the stats to
//     the transport's own counters for a bf16 wire.
//  2. Derived bound (docs/NUMERICS.md): a value that crosses h links as bf16
//     (each hop rounds the partial sum it sends, to nearest even, u = 2^-8)
//     and is summed in f32 errs by at most ((1+v)^h - 1)·A, v = u + 2^-24 +
//     2^-32, A = the sum over the token's pairs of |their contribution|
//     (reference_contribution_magnitudes): h = R-1 on the ring's
//     reduce-scatter, h = 1 on the all-to-all (one rounded row per (token,
//     rank), summed at home). Every element of y and dx within that bound +
//     1e-5·max|exact|; every weight gradient within 1e-5 (no rounding reaches
//     them). And the rounding is really there: y's and dx's largest error is
//     above 1e-4 of max|exact| (an f32 wire gives ~1e-7).
// Topology: ranks as threads over the threads transport (run_ep_layer), one
// compute thread per rank; R = 4, 2 chunks, both dispatchers.
#include <gtest/gtest.h>

#include <cmath>

#include "ep_harness.h"
#include "kernels/convert.h"

namespace epmoe {
namespace {

using testing::EpRunOptions;
using testing::MoeProblem;

EpRunOptions wire_options(DispatchKind dispatch, WireDType wire) {
  EpRunOptions options{.num_ranks = 4, .dispatch = dispatch};
  options.ep.num_chunks = 2;
  options.ep.wire_dtype = wire;
  return options;
}

TEST(Bf16Wire, HalvesTheCombineCotangentAndDxBytesOnBothDispatchers) {
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 8, .top_k = 2};
  const MoeProblem p = testing::make_problem(16, 32, 8, router, 35);
  for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    const bool ring = dispatch == DispatchKind::ring;
    const std::vector<std::string> halved =
        ring ? std::vector<std::string>{"forward/reduce_scatter combine", "backward/ring_all_gather cotangent",
                                        "backward/reduce_scatter dx"}
             : std::vector<std::string>{"forward/all_to_all_v combine", "backward/all_to_all_v cotangent",
                                        "backward/all_to_all_v dx"};
    const std::string dweights = ring ? "backward/reduce_scatter dweights" : "backward/all_to_all_v dweights";
    const auto f32 = testing::run_ep_layer(p, wire_options(dispatch, WireDType::f32)).stats;
    const auto bf16 = testing::run_ep_layer(p, wire_options(dispatch, WireDType::bf16)).stats;
    for (int r = 0; r < 4; ++r) {
      for (const std::string& name : halved) {
        EXPECT_GT(f32[r].bytes_sent.at(name), 0) << name << " rank " << r;
        EXPECT_EQ(bf16[r].bytes_sent.at(name) * 2, f32[r].bytes_sent.at(name)) << name << " rank " << r;
      }
      EXPECT_EQ(bf16[r].bytes_sent.at(dweights), f32[r].bytes_sent.at(dweights)) << dweights << " rank " << r;
    }
  }
}

TEST(Bf16Wire, StaysWithinTheDerivedBoundOfTheDoubleReference) {
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 8, .top_k = 3};
  MoeProblem p = testing::make_problem(24, 32, 16, router, 36);
  // dy bf16-representable: the cotangent travels exactly (see the top).
  for (float& v : p.dy.span<float>()) v = bf16_to_float(float_to_bf16(v));
  constexpr double kU = 1.0 / 256, kF32 = 1.0 / (1 << 24);
  const double v = kU + kF32 + kU * kF32;
  for (auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    const testing::EpRunResult run = testing::run_ep_layer(p, wire_options(dispatch, WireDType::bf16));
    const auto ids = testing::ids_of(run.topk_ids);
    const testing::ReferenceResult exact = testing::reference_moe(p, ids);
    const testing::ContributionMagnitudes magnitude = testing::reference_contribution_magnitudes(p, ids);
    const int hops = dispatch == DispatchKind::ring ? 4 - 1 : 1;
    const double factor = std::pow(1 + v, hops) * (1 + kF32) - 1;
    const std::string what = "bf16 wire " + to_string(dispatch);
    auto check = [&](const char* name, const Tensor& got, const std::vector<double>& ref,
                     const std::vector<double>& contributions) {
      double max_ref = 0, max_error = 0;
      for (double value : ref) max_ref = std::max(max_ref, std::abs(value));
      for (std::size_t i = 0; i < ref.size(); ++i) {
        const double error = std::abs(double(got.data<float>()[i]) - ref[i]);
        max_error = std::max(max_error, error);
        ASSERT_LE(error, factor * contributions[i] + 1e-5 * max_ref) << what << " " << name << " element " << i;
      }
      EXPECT_GT(max_error, 1e-4 * max_ref) << what << " " << name << ": no bf16 rounding on the wire?";
    };
    check("y", run.y, exact.y, magnitude.y);
    check("dx", run.grads.dx, exact.dx, magnitude.dx);
    EXPECT_LE(testing::relative_error(run.grads.dgate, exact.dgate), 1e-5) << what;
    EXPECT_LE(testing::relative_error(run.grads.dwi0, exact.dwi0), 1e-5) << what;
    EXPECT_LE(testing::relative_error(run.grads.dwi1, exact.dwi1), 1e-5) << what;
    EXPECT_LE(testing::relative_error(run.grads.dwo, exact.dwo), 1e-5) << what;
  }
}

}  // namespace
}  // namespace epmoe
