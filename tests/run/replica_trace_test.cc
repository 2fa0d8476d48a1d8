// Replica weights and gradients move early and overlapped, on the modelled
// clock (issue 31 item 2), as its trace shows them: each rank's transfers of
// a step run as one collective, "replica weights tag T" / "replica gradients
// tag T", and
//  * the weights leave as soon as the plan is known: their event starts
//    before the rank's token encode (compute) ends, and ends before its
//    experts compute (which read them);
//  * the gradients leave once the experts' backward wrote every slot's dW:
//    their event overlaps the dx all-to-all that brings the input gradient
//    back, and where they outlast it the router's backward runs before the
//    layer waits for them.
// Before, the weights were posted after the tokens were encoded and the
// gradients after dx had come back, as loose messages without a name.
//
// Topology: R = 4 rank threads, clock=modelled (h100: links switched
// 450 GB/s, 2 us), N = 256 tokens, H = 64, F = 128, E = 8, top-2 softmax
// router on seeded random arrays; balance=dynamic redundant_slots=2
// replica_costs=off rebalance_threshold=1.0 (the balance plan, so replicas
// are placed whatever they cost); all-to-all dispatch, forward + backward.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <epmoe/whole_world_layer.h>

#include <nlohmann/json.hpp>

#include "data/test_files.h"

namespace epmoe {
namespace {

constexpr std::int64_t kTraceTokens = 256, kTraceHidden = 64, kTraceFfn = 128;
constexpr int kTraceExperts = 8, kTraceTopK = 2, kTraceRanks = 4;

struct Span {
  double begin = std::numeric_limits<double>::infinity(), end = -std::numeric_limits<double>::infinity();
  bool found() const { return begin <= end; }
  bool overlaps(const Span& other) const { return begin < other.end && other.begin < end; }
};

// The span of a rank's first (or with `last`, last) event whose name
// starts with `prefix` (tags vary); not found() if none.
Span span_of(const nlohmann::json& events, int rank, const std::string& prefix, bool last = false) {
  Span span;
  for (const nlohmann::json& event : events) {
    if (event["ph"] != "X" || event["pid"].get<int>() != rank) continue;
    if (event["name"].get<std::string>().rfind(prefix, 0) != 0) continue;
    const double begin = event["ts"].get<double>(), end = begin + event["dur"].get<double>();
    if (!span.found() || (last ? begin >= span.begin : begin < span.begin)) span = {begin, end};
  }
  return span;
}

TEST(ReplicaTrace, WeightsAndGradientsMoveOverlappedUnderTheirOwnNames) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> x(kTraceTokens * kTraceHidden), gate(kTraceHidden * kTraceExperts),
      wi0(kTraceExperts * kTraceHidden * kTraceFfn), wi1(kTraceExperts * kTraceHidden * kTraceFfn),
      wo(kTraceExperts * kTraceFfn * kTraceHidden), dy(kTraceTokens * kTraceHidden);
  for (std::vector<float>* v : {&x, &gate, &wi0, &wi1, &wo, &dy})
    for (float& value : *v) value = normal(rng);
  std::vector<float> y(kTraceTokens * kTraceHidden), topk_weights(kTraceTokens * kTraceTopK),
      dx(kTraceTokens * kTraceHidden), dgate(kTraceHidden * kTraceExperts), dwi0(wi0.size()), dwi1(wi1.size()),
      dwo(wo.size());
  std::vector<std::int32_t> topk_ids(kTraceTokens * kTraceTopK);

  const testing::ScratchDir scratch;
  const std::string trace = (scratch / "trace.json").string();
  WholeWorldLayer layer({{"ranks", std::to_string(kTraceRanks)},
                         {"threads", std::to_string(kTraceRanks)},
                         {"top_k", std::to_string(kTraceTopK)},
                         {"clock", "modelled"},
                         {"balance", "dynamic"},
                         {"redundant_slots", "2"},
                         {"replica_costs", "off"},
                         {"rebalance_threshold", "1.0"},
                         {"trace_file", trace}});
  layer.run({.x = TensorView(x.data(), {kTraceTokens, kTraceHidden}),
             .gate = TensorView(gate.data(), {kTraceHidden, kTraceExperts}),
             .wi0 = TensorView(wi0.data(), {kTraceExperts, kTraceHidden, kTraceFfn}),
             .wi1 = TensorView(wi1.data(), {kTraceExperts, kTraceHidden, kTraceFfn}),
             .wo = TensorView(wo.data(), {kTraceExperts, kTraceFfn, kTraceHidden}),
             .dy = TensorView(dy.data(), {kTraceTokens, kTraceHidden})},
            {.y = MutableTensorView(y.data(), {kTraceTokens, kTraceHidden}),
             .topk_ids = MutableTensorView(topk_ids.data(), {kTraceTokens, kTraceTopK}),
             .topk_weights = MutableTensorView(topk_weights.data(), {kTraceTokens, kTraceTopK}),
             .dx = MutableTensorView(dx.data(), {kTraceTokens, kTraceHidden}),
             .dgate = MutableTensorView(dgate.data(), {kTraceHidden, kTraceExperts}),
             .dwi0 = MutableTensorView(dwi0.data(), {kTraceExperts, kTraceHidden, kTraceFfn}),
             .dwi1 = MutableTensorView(dwi1.data(), {kTraceExperts, kTraceHidden, kTraceFfn}),
             .dwo = MutableTensorView(dwo.data(), {kTraceExperts, kTraceFfn, kTraceHidden})});
  ASSERT_GT(nlohmann::json::parse(layer.metrics_json()).at("balance").at("num_replicas").get<int>(), 0);
  const nlohmann::json events = nlohmann::json::parse(testing::read_bytes(trace))["traceEvents"];

  int ranks_with_weights = 0, ranks_with_gradients = 0, ranks_where_gradients_outlast_dx = 0;
  for (int rank = 0; rank < kTraceRanks; ++rank) {
    const std::string where = "rank " + std::to_string(rank);
    const Span weights = span_of(events, rank, "replica weights tag ");
    if (weights.found()) {
      ++ranks_with_weights;
      const Span encode = span_of(events, rank, "token encode");
      const Span experts = span_of(events, rank, "expert group forward");
      ASSERT_TRUE(encode.found() && experts.found()) << where;
      EXPECT_GT(weights.end, weights.begin) << where;
      EXPECT_LE(weights.begin, encode.begin) << where << ": the weights leave before the tokens are encoded";
      EXPECT_TRUE(weights.overlaps(encode)) << where << ": the weights move while the rank encodes its tokens";
      EXPECT_LE(weights.end, experts.begin) << where << ": the experts compute on arrived weights";
    }
    const Span gradients = span_of(events, rank, "replica gradients tag ");
    if (gradients.found()) {
      ++ranks_with_gradients;
      // The backward's last all-to-all to begin brings dx back; the router's
      // backward (its gemms, the rank's last compute) runs in the meantime.
      const Span dx_return = span_of(events, rank, "all_to_all_v tag ", /*last=*/true);
      const Span wgrad = span_of(events, rank, "expert group wgrad", /*last=*/true);
      const Span router_backward = span_of(events, rank, "gemm", /*last=*/true);
      ASSERT_TRUE(dx_return.found() && wgrad.found() && router_backward.found()) << where;
      EXPECT_GE(gradients.begin, wgrad.end) << where << ": every slot's dW is written before it leaves";
      if (gradients.end > dx_return.end) {
        EXPECT_LT(router_backward.begin, gradients.end) << where << ": the router's backward does not wait for them";
        ++ranks_where_gradients_outlast_dx;
      }
      EXPECT_TRUE(gradients.overlaps(dx_return)) << where << ": the gradients move while dx comes back";
    }
  }
  EXPECT_GT(ranks_with_weights, 0);
  EXPECT_GT(ranks_with_gradients, 0);
  EXPECT_GT(ranks_where_gradients_outlast_dx, 0) << "the router's case is not exercised";
}

}  // namespace
}  // namespace epmoe
