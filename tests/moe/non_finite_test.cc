// Non-finite numbers never pass the MoE layer silently (single rank, N=6,
// H=8, F=8, E=4, K=2, label "moe layer 1"):
//  1. a NaN, +inf or -inf at the first, a middle or the last element of any
//     input (x, gate, wi0, wi1, wo, bias, dy, extra_d_logits) is refused
//     with the tensor's name and the element's index, for every router;
//  2. a refused input leaves the layer as it was (the next good step gives
//     the bits of a fresh layer);
//  3. finite inputs whose step overflows are reported with the phase: router
//     logits (forward/route), expert output (forward/experts, naming the row
//     and its local expert), and a gradient in backward/experts;
//  4. under expert parallelism (2 ranks as threads, both dispatchers), an
//     overflow in rank 1's experts mid-step fails the run with rank 1's
//     NumericError, and rank 0, waiting for rank 1's outputs, is woken with
//     a PeerError that carries rank 1's message (no hang).
// Topology: one rank, except 4: R = 2 ranks as threads over the threads
// transport, cores / R compute threads each (1 on 2 cores).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>

#include <epmoe/moe_layer.h>
#include "core/error.h"
#include "core/finite_check.h"
#include "ep/ep_config.h"
#include "moe/router.h"
#include "reference_moe.h"
#include "single_rank_layer.h"
#include "transport/threads/launcher.h"

namespace epmoe {
namespace {

using testing::MoeProblem;

const float kBadValues[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
const char* const kBadNames[] = {"nan", "inf", "-inf"};

MoeLayerConfig layer_config(const MoeProblem& p) {
  return {.hidden = p.hidden, .ffn = p.ffn, .router = p.router, .label = "moe layer 1"};
}

MoeWeights weights_of(const MoeProblem& p) { return {p.gate, p.wi0, p.wi1, p.wo, p.bias}; }

// The NumericError message of one forward + backward ("" when none).
std::string step_error(MoeLayer& layer, const MoeProblem& p, TensorView extra_d_logits = {}) {
  try {
    layer.forward(p.x, weights_of(p));
    layer.backward(p.dy, extra_d_logits);
  } catch (const NumericError& e) {
    return e.what();
  }
  return "";
}

std::vector<RouterConfig> some_routers() {
  return {{.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 2},
          {.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 2, .norm_topk_prob = false},
          {.kind = RouterKind::sigmoid_grouped,
           .num_experts = 4,
           .top_k = 2,
           .n_groups = 2,
           .topk_groups = 1,
           .routed_scaling_factor = 2.5f}};
}

TEST(NonFiniteInputs, RefusedWithTensorNameAndFirstBadIndex) {
  struct Input {
    const char* name;
    std::function<Tensor&(MoeProblem&)> tensor;
  };
  const std::vector<Input> inputs = {
      {"x", [](MoeProblem& p) -> Tensor& { return p.x; }},
      {"gate", [](MoeProblem& p) -> Tensor& { return p.gate; }},
      {"wi0", [](MoeProblem& p) -> Tensor& { return p.wi0; }},
      {"wi1", [](MoeProblem& p) -> Tensor& { return p.wi1; }},
      {"wo", [](MoeProblem& p) -> Tensor& { return p.wo; }},
      {"bias", [](MoeProblem& p) -> Tensor& { return p.bias; }},
      {"dy", [](MoeProblem& p) -> Tensor& { return p.dy; }},
  };
  for (const RouterConfig& router : some_routers()) {
    MoeProblem p = testing::make_problem(6, 8, 8, router, 41);
    testing::SingleRankLayer layer(layer_config(p));
    ASSERT_EQ(step_error(layer, p), "") << "the clean problem must pass";
    for (const Input& input : inputs) {
      Tensor& t = input.tensor(p);
      for (std::int64_t flat : {std::int64_t{0}, t.numel() / 2 + 1, t.numel() - 1}) {
        for (int b = 0; b < 3; ++b) {
          const float saved = t.data<float>()[flat];
          t.data<float>()[flat] = kBadValues[b];
          EXPECT_EQ(step_error(layer, p), std::string("moe layer 1: ") + input.name + index_to_string(t.shape(), flat) +
                                              " = " + kBadNames[b] + ": inputs must be finite")
              << to_string(router.kind);
          t.data<float>()[flat] = saved;
        }
      }
    }
    // The load-balance loss's logit gradient is an input of backward too.
    Tensor extra = Tensor::zeros(DType::f32, {6, 4});
    extra.data<float>()[23] = kBadValues[0];
    EXPECT_EQ(step_error(layer, p, extra), "moe layer 1: extra_d_logits[5, 3] = nan: inputs must be finite");
  }
}

TEST(NonFiniteInputs, UnlabelledLayerSaysMoeLayer) {
  MoeProblem p = testing::make_problem(3, 8, 8, some_routers()[0], 42);
  p.x.data<float>()[8 * 2 + 7] = kBadValues[1];
  testing::SingleRankLayer layer({.hidden = p.hidden, .ffn = p.ffn, .router = p.router});
  EXPECT_EQ(step_error(layer, p), "moe layer: x[2, 7] = inf: inputs must be finite");
}

TEST(NonFiniteInputs, RefusalLeavesTheLayerUsable) {
  MoeProblem p = testing::make_problem(6, 8, 8, some_routers()[0], 43);
  testing::SingleRankLayer layer(layer_config(p)), fresh(layer_config(p));
  const float saved = p.wo.data<float>()[5];
  p.wo.data<float>()[5] = kBadValues[0];
  ASSERT_NE(step_error(layer, p), "");
  p.wo.data<float>()[5] = saved;
  const MoeForwardOutput a = layer.forward(p.x, weights_of(p));
  // A refused dy keeps the forward's saved state: backward can be retried.
  const float saved_dy = p.dy.data<float>()[0];
  p.dy.data<float>()[0] = kBadValues[2];
  try {
    layer.backward(p.dy);
    ADD_FAILURE() << "accepted -inf in dy";
  } catch (const NumericError& e) {
    EXPECT_STREQ(e.what(), "moe layer 1: dy[0, 0] = -inf: inputs must be finite");
  }
  p.dy.data<float>()[0] = saved_dy;
  const MoeGradients ga = layer.backward(p.dy);
  const MoeForwardOutput b = fresh.forward(p.x, weights_of(p));
  const MoeGradients gb = fresh.backward(p.dy);
  EXPECT_EQ(std::memcmp(a.y.raw(), b.y.raw(), a.y.size_bytes()), 0);
  EXPECT_EQ(std::memcmp(ga.dx.raw(), gb.dx.raw(), ga.dx.size_bytes()), 0);
  EXPECT_EQ(std::memcmp(ga.dgate.raw(), gb.dgate.raw(), ga.dgate.size_bytes()), 0);
}

// wi0/wi1/wo are re-checked unless the caller's weight version and buffers
// are those of a forward that found them finite (the version's contract:
// same version, same values).
TEST(NonFiniteInputs, ExpertWeightsRecheckedOnANewVersion) {
  MoeProblem p = testing::make_problem(6, 8, 8, some_routers()[0], 47);
  testing::SingleRankLayer layer(layer_config(p));
  auto forward_error = [&](std::optional<std::uint64_t> version) -> std::string {
    try {
      layer.forward(p.x, weights_of(p), {.weight_version = version});
    } catch (const NumericError& e) {
      return e.what();
    }
    return "";
  };
  ASSERT_EQ(forward_error(5), "");
  p.wi1.data<float>()[7] = kBadValues[1];
  const std::string refused = "moe layer 1: wi1[0, 0, 7] = inf: inputs must be finite";
  EXPECT_EQ(forward_error(6), refused);
  EXPECT_EQ(forward_error(std::nullopt), refused);
  EXPECT_EQ(forward_error(5), refused) << "a refusal forgets the versions seen before";
}

TEST(NonFiniteInsideStep, RouterLogitOverflowNamesForwardRoute) {
  MoeProblem p = testing::make_problem(6, 8, 8, some_routers()[0], 44);
  // Token 2's logit for expert 0: 8 terms of 3e38 * 1 overflow to inf (the
  // other tokens' logits stay O(1)).
  for (std::int64_t h = 0; h < 8; ++h) {
    p.x.data<float>()[2 * 8 + h] = 3e38f;
    p.gate.data<float>()[h * 4 + 0] = 1.0f;
  }
  testing::SingleRankLayer layer(layer_config(p));
  EXPECT_EQ(step_error(layer, p), "moe layer 1: non-finite value in router logits (forward/route) at row 2: inf");
}

TEST(NonFiniteInsideStep, ExpertOverflowNamesForwardExpertsRowAndExpert) {
  MoeProblem p = testing::make_problem(6, 8, 8, some_routers()[0], 45);
  // Token 4 at 1e20: its logits and routing stay finite, but silu(x wi0) *
  // (x wi1) ~ 1e40 overflows in the experts.
  for (std::int64_t h = 0; h < 8; ++h) p.x.data<float>()[4 * 8 + h] *= 1e20f;
  testing::SingleRankLayer layer(layer_config(p));
  const std::string message = step_error(layer, p);
  // Rows are sorted by expert (stable, token order within an expert), so
  // token 4's first row belongs to its lower expert.
  // The layer's routing, from the router it runs (the step that failed is gone).
  const RouterOutput routing = Router(p.router).forward(p.x, p.gate);
  const auto ids = routing.topk_ids.span<std::int32_t>();
  const int expert = std::min(ids[4 * 2], ids[4 * 2 + 1]);
  std::int64_t row = 0;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(ids.size()); ++i)
    if (ids[i] < expert || (ids[i] == expert && i / 2 < 4)) ++row;
  const std::string expected = "moe layer 1: non-finite value in expert output (forward/experts) at row " +
                               std::to_string(row) + " of chunk 0 (local expert " + std::to_string(expert) + "): ";
  EXPECT_EQ(message.substr(0, expected.size()), expected) << message;
}

TEST(NonFiniteInsideStep, GradientOverflowNamesABackwardPhase) {
  MoeProblem p = testing::make_problem(6, 8, 8, some_routers()[0], 46);
  testing::SingleRankLayer layer(layer_config(p));
  // dy at the largest float: the forward is untouched, the backward's
  // products with wo overflow.
  for (std::int64_t h = 0; h < 8; ++h) p.dy.data<float>()[1 * 8 + h] = std::numeric_limits<float>::max();
  const std::string message = step_error(layer, p);
  EXPECT_EQ(message.rfind("moe layer 1: non-finite value in ", 0), 0u) << message;
  EXPECT_NE(message.find("(backward/experts)"), std::string::npos) << message;
}

TEST(NonFiniteInsideStep, ExpertParallelOverflowFailsEveryRankWithoutHanging) {
  const int num_ranks = 2;
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 2};
  const MoeProblem p = testing::make_problem(16, 8, 8, router, 48);
  for (DispatchKind dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    EpConfig config{.dispatch = dispatch, .num_experts = 4, .top_k = 2, .hidden = 8};
    std::vector<std::string> seen(num_ranks);
    std::mutex mutex;
    std::string thrown;
    try {
      transport::threads::run_ranks(num_ranks, {}, [&](transport::Communicator& comm) {
        const int r = comm.rank();
        // Rank r holds tokens [8r, 8r + 8) and experts {2r, 2r + 1}; rank
        // 1's wi0 and wi1 at 1e20 make silu(x wi0) * (x wi1) ~ 1e40 = inf.
        Tensor x(DType::f32, {8, 8});
        std::copy_n(p.x.data<float>() + r * 64, 64, x.data<float>());
        Tensor wi0(DType::f32, {2, 8, 8}), wi1(DType::f32, {2, 8, 8}), wo(DType::f32, {2, 8, 8});
        const float scale = r == 1 ? 1e20f : 1.0f;
        for (std::int64_t i = 0; i < 128; ++i) {
          wi0.data<float>()[i] = p.wi0.data<float>()[r * 128 + i] * scale;
          wi1.data<float>()[i] = p.wi1.data<float>()[r * 128 + i] * scale;
          wo.data<float>()[i] = p.wo.data<float>()[r * 128 + i];
        }
        EpGroup group(comm, config);
        MoeLayer layer(layer_config(p), group);
        try {
          layer.forward(x, {p.gate, wi0, wi1, wo, p.bias});
        } catch (const Error& e) {
          std::lock_guard<std::mutex> lock(mutex);
          seen[r] = std::string(dynamic_cast<const NumericError*>(&e) ? "NumericError: "
                                : dynamic_cast<const PeerError*>(&e)  ? "PeerError: "
                                                                      : "Error: ") +
                    e.what();
          throw;
        }
      });
    } catch (const NumericError& e) {
      thrown = e.what();
    }
    const std::string cause = "moe layer 1: non-finite value in expert output (forward/experts) at row ";
    EXPECT_EQ(thrown.rfind(cause, 0), 0u) << to_string(dispatch) << ": " << thrown;
    EXPECT_EQ(seen[1].rfind("NumericError: " + cause, 0), 0u) << seen[1];
    EXPECT_EQ(seen[0].rfind("PeerError: ", 0), 0u) << seen[0];
    EXPECT_NE(seen[0].find(cause), std::string::npos) << "rank 0 is told rank 1's cause: " << seen[0];
  }
}

}  // namespace
}  // namespace epmoe
