// MoeLayer's split-phase calls (begin/finish forward and backward): the same
// bits as forward()/backward() with other work in between, and a clear
// UsageError for every call out of order, leaving the layer usable.
// Single rank; the expert-parallel form is in tests/ep/dispatch_handle_test.cc.
#include <gtest/gtest.h>

#include <algorithm>

#include <epmoe/moe_layer.h>
#include "core/error.h"
#include "reference_moe.h"
#include "single_rank_layer.h"

namespace epmoe {
namespace {

using testing::same_bits;

struct Fixture {
  testing::MoeProblem p = testing::make_problem(
      37, 16, 12, RouterConfig{.kind = RouterKind::softmax_topk, .num_experts = 6, .top_k = 2}, 5);
  MoeLayerConfig config{.hidden = 16, .ffn = 12, .router = p.router};
  MoeWeights w{p.gate, p.wi0, p.wi1, p.wo, {}};
};

TEST(SplitPhase, InterleavedWorkGivesTheSameBits) {
  Fixture f;
  testing::SingleRankLayer whole(f.config), split(f.config);
  const MoeForwardOutput out = whole.forward(f.p.x, f.w);
  const MoeGradients grads = whole.backward(f.p.dy);

  MoeStep step = split.begin_forward(f.p.x, f.w);
  // Unrelated work between a begin and its finish (what a shared expert is).
  testing::SingleRankLayer other(f.config);
  const MoeForwardOutput other_out = other.forward(f.p.x, f.w);
  const MoeForwardOutput split_out = split.finish_forward(step);
  split.begin_backward(step, f.p.dy);
  other.backward(f.p.dy);
  const MoeGradients split_grads = split.finish_backward(step);
  EXPECT_FALSE(step.active());

  EXPECT_TRUE(same_bits(out.y, split_out.y));
  EXPECT_TRUE(same_bits(out.y, other_out.y));
  EXPECT_TRUE(same_bits(grads.dx, split_grads.dx));
  EXPECT_TRUE(same_bits(grads.dgate, split_grads.dgate));
  EXPECT_TRUE(same_bits(grads.dwi0, split_grads.dwi0));
  EXPECT_TRUE(same_bits(grads.dwi1, split_grads.dwi1));
  EXPECT_TRUE(same_bits(grads.dwo, split_grads.dwo));
}

// Two micro-batches in flight on one layer, interleaved (both forwards, then
// both backwards in either order), give each micro-batch the bits it gets
// alone. The expert-parallel form is in tests/ep/micro_batch_test.cc.
TEST(SplitPhase, TwoStepsInFlightOnOneLayerGiveEachItsOwnBits) {
  Fixture f;
  const testing::MoeProblem q = testing::make_problem(29, 16, 12, f.p.router, 8);
  const MoeWeights w{f.p.gate, f.p.wi0, f.p.wi1, f.p.wo, {}};  // both micro-batches share the weights
  testing::SingleRankLayer alone(f.config);
  const MoeForwardOutput out_a = alone.forward(f.p.x, w);
  const MoeGradients grads_a = alone.backward(f.p.dy);
  const MoeForwardOutput out_b = alone.forward(q.x, w);
  const MoeGradients grads_b = alone.backward(q.dy);
  for (const bool b_first : {false, true}) {
    SCOPED_TRACE(b_first ? "backward b then a" : "backward a then b");
    testing::SingleRankLayer layer(f.config);
    MoeStep a = layer.begin_forward(f.p.x, w);
    MoeStep b = layer.begin_forward(q.x, w);
    const MoeForwardOutput got_b = layer.finish_forward(b);
    const MoeForwardOutput got_a = layer.finish_forward(a);
    MoeGradients got_grads_a, got_grads_b;
    if (b_first) {
      layer.begin_backward(b, q.dy);
      layer.begin_backward(a, f.p.dy);
      got_grads_b = layer.finish_backward(b);
      got_grads_a = layer.finish_backward(a);
    } else {
      layer.begin_backward(a, f.p.dy);
      got_grads_a = layer.finish_backward(a);
      layer.begin_backward(b, q.dy);
      got_grads_b = layer.finish_backward(b);
    }
    EXPECT_TRUE(same_bits(out_a.y, got_a.y));
    EXPECT_TRUE(same_bits(out_b.y, got_b.y));
    for (const auto& [want, got] : {std::pair{&grads_a, &got_grads_a}, std::pair{&grads_b, &got_grads_b}}) {
      EXPECT_TRUE(same_bits(want->dx, got->dx));
      EXPECT_TRUE(same_bits(want->dgate, got->dgate));
      EXPECT_TRUE(same_bits(want->dwi0, got->dwi0));
      EXPECT_TRUE(same_bits(want->dwo, got->dwo));
    }
  }
}

// Calls out of a step's order throw UsageError naming the call; the step in
// progress (if any) is untouched, so the right call still works afterwards.
TEST(SplitPhase, OutOfOrderCallsAreRefusedAndLeaveTheStepUsable) {
  Fixture f;
  testing::SingleRankLayer layer(f.config);
  const auto expect_refused = [](auto call, const std::string& name, const std::string& why) {
    try {
      call();
      ADD_FAILURE() << name << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(name + "() " + why), std::string::npos) << e.what();
    }
  };
  const std::string not_under_way = "on a step that is not under way", out_of_order = "out of order";
  MoeStep never;
  expect_refused([&] { layer.finish_forward(never); }, "finish_forward", not_under_way);
  expect_refused([&] { layer.begin_backward(never, f.p.dy); }, "begin_backward", not_under_way);
  expect_refused([&] { layer.backward(f.p.dy); }, "begin_backward", not_under_way);
  expect_refused([&] { layer.finish_backward(never); }, "finish_backward", not_under_way);

  MoeStep step = layer.begin_forward(f.p.x, f.w);
  expect_refused([&] { layer.begin_backward(step, f.p.dy); }, "begin_backward", out_of_order);
  expect_refused([&] { layer.finish_backward(step); }, "finish_backward", out_of_order);
  testing::SingleRankLayer other(f.config);
  expect_refused([&] { other.finish_forward(step); }, "finish_forward", "on a step of another layer");
  const MoeForwardOutput out = layer.finish_forward(step);
  expect_refused([&] { layer.finish_forward(step); }, "finish_forward", out_of_order);
  expect_refused([&] { layer.finish_backward(step); }, "finish_backward", out_of_order);

  layer.begin_backward(step, f.p.dy);
  expect_refused([&] { layer.begin_backward(step, f.p.dy); }, "begin_backward", out_of_order);
  expect_refused([&] { layer.finish_forward(step); }, "finish_forward", out_of_order);
  const MoeGradients grads = layer.finish_backward(step);
  expect_refused([&] { layer.finish_backward(step); }, "finish_backward", not_under_way);
  expect_refused([&] { layer.begin_backward(step, f.p.dy); }, "begin_backward", not_under_way);

  // The refusals changed nothing: the same bits as a fresh layer.
  testing::SingleRankLayer fresh(f.config);
  EXPECT_TRUE(same_bits(out.y, fresh.forward(f.p.x, f.w).y));
  EXPECT_TRUE(same_bits(grads.dwo, fresh.backward(f.p.dy).dwo));
}

// A forward without a backward (inference) may be followed by a new forward.
TEST(SplitPhase, ForwardOnlyStepsMayRepeat) {
  Fixture f;
  testing::SingleRankLayer layer(f.config);
  const MoeForwardOutput first = layer.forward(f.p.x, f.w);
  const MoeForwardOutput second = layer.forward(f.p.x, f.w);
  EXPECT_TRUE(same_bits(first.y, second.y));
  layer.backward(f.p.dy);
}

// The caller's output buffers receive the outputs in place (the returned
// tensors stay empty) with the bits of the allocated ones, and a buffer of
// the wrong shape is refused before any work, naming it.
TEST(SplitPhase, OutputsGoIntoTheCallersBuffers) {
  Fixture f;
  testing::SingleRankLayer allocating(f.config), in_place(f.config);
  const MoeForwardOutput out = allocating.forward(f.p.x, f.w);
  const MoeGradients grads = allocating.backward(f.p.dy);
  Tensor y(DType::f32, out.y.shape()), ids(DType::i32, out.topk_ids.shape()),
      weights(DType::f32, out.topk_weights.shape());
  Tensor dx(DType::f32, grads.dx.shape()), dgate(DType::f32, grads.dgate.shape()), dwi0(DType::f32, grads.dwi0.shape()),
      dwi1(DType::f32, grads.dwi1.shape()), dwo(DType::f32, grads.dwo.shape());
  Tensor wrong(DType::f32, {1, 2});
  EXPECT_THROW(in_place.forward(f.p.x, f.w, {}, {.y = wrong}), UsageError);
  const MoeForwardOutput none = in_place.forward(f.p.x, f.w, {}, {.y = y, .topk_ids = ids, .topk_weights = weights});
  EXPECT_TRUE(none.y.empty() && none.topk_ids.empty() && none.topk_weights.empty());
  const MoeGradients no_grads =
      in_place.backward(f.p.dy, {}, {.dx = dx, .dgate = dgate, .dwi0 = dwi0, .dwi1 = dwi1, .dwo = dwo});
  EXPECT_TRUE(no_grads.dx.empty() && no_grads.dwo.empty());
  EXPECT_TRUE(same_bits(out.y, y));
  EXPECT_TRUE(same_bits(out.topk_ids, ids));
  EXPECT_TRUE(same_bits(out.topk_weights, weights));
  EXPECT_TRUE(same_bits(grads.dx, dx));
  EXPECT_TRUE(same_bits(grads.dgate, dgate));
  EXPECT_TRUE(same_bits(grads.dwi0, dwi0));
  EXPECT_TRUE(same_bits(grads.dwi1, dwi1));
  EXPECT_TRUE(same_bits(grads.dwo, dwo));
}

}  // namespace
}  // namespace epmoe
