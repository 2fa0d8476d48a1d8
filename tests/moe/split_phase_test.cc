// MoeLayer's split-phase calls (begin/finish forward and backward): the same
// bits as forward()/backward() with other work in between, and a clear
// UsageError for every call out of order, leaving the layer usable.
// Single rank; the expert-parallel form is in tests/ep/dispatch_handle_test.cc.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "moe/moe_layer.h"
#include "reference_moe.h"

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
  MoeLayer whole(f.config), split(f.config);
  const MoeForwardOutput out = whole.forward(f.p.x, f.w);
  const MoeGradients grads = whole.backward(f.p.dy);

  split.begin_forward(f.p.x, f.w);
  // Unrelated work between a begin and its finish (what a shared expert is).
  MoeLayer other(f.config);
  const MoeForwardOutput other_out = other.forward(f.p.x, f.w);
  const MoeForwardOutput split_out = split.finish_forward();
  split.begin_backward(f.p.dy);
  other.backward(f.p.dy);
  const MoeGradients split_grads = split.finish_backward();

  EXPECT_TRUE(same_bits(out.y, split_out.y));
  EXPECT_TRUE(same_bits(out.y, other_out.y));
  EXPECT_TRUE(same_bits(grads.dx, split_grads.dx));
  EXPECT_TRUE(same_bits(grads.dgate, split_grads.dgate));
  EXPECT_TRUE(same_bits(grads.dwi0, split_grads.dwi0));
  EXPECT_TRUE(same_bits(grads.dwi1, split_grads.dwi1));
  EXPECT_TRUE(same_bits(grads.dwo, split_grads.dwo));
}

// Calls out of order throw UsageError naming the call; the step in progress
// (if any) is untouched, so the right call still works afterwards.
TEST(SplitPhase, OutOfOrderCallsAreRefusedAndLeaveTheLayerUsable) {
  Fixture f;
  MoeLayer layer(f.config);
  const auto expect_refused = [](auto call, const char* name) {
    try {
      call();
      ADD_FAILURE() << name << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(name) + "() out of order"), std::string::npos) << e.what();
    }
  };
  expect_refused([&] { layer.finish_forward(); }, "finish_forward");
  expect_refused([&] { layer.begin_backward(f.p.dy); }, "begin_backward");
  expect_refused([&] { layer.backward(f.p.dy); }, "begin_backward");
  expect_refused([&] { layer.finish_backward(); }, "finish_backward");

  layer.begin_forward(f.p.x, f.w);
  expect_refused([&] { layer.begin_forward(f.p.x, f.w); }, "begin_forward");
  expect_refused([&] { layer.begin_backward(f.p.dy); }, "begin_backward");
  expect_refused([&] { layer.finish_backward(); }, "finish_backward");
  const MoeForwardOutput out = layer.finish_forward();
  expect_refused([&] { layer.finish_forward(); }, "finish_forward");
  expect_refused([&] { layer.finish_backward(); }, "finish_backward");

  layer.begin_backward(f.p.dy);
  expect_refused([&] { layer.begin_backward(f.p.dy); }, "begin_backward");
  expect_refused([&] { layer.begin_forward(f.p.x, f.w); }, "begin_forward");
  const MoeGradients grads = layer.finish_backward();
  expect_refused([&] { layer.finish_backward(); }, "finish_backward");
  expect_refused([&] { layer.begin_backward(f.p.dy); }, "begin_backward");

  // The refusals changed nothing: the same bits as a fresh layer.
  MoeLayer fresh(f.config);
  EXPECT_TRUE(same_bits(out.y, fresh.forward(f.p.x, f.w).y));
  EXPECT_TRUE(same_bits(grads.dwo, fresh.backward(f.p.dy).dwo));
}

// A forward without a backward (inference) may be followed by a new forward.
TEST(SplitPhase, ForwardOnlyStepsMayRepeat) {
  Fixture f;
  MoeLayer layer(f.config);
  const MoeForwardOutput first = layer.forward(f.p.x, f.w);
  const MoeForwardOutput second = layer.forward(f.p.x, f.w);
  EXPECT_TRUE(same_bits(first.y, second.y));
  layer.backward(f.p.dy);
}

}  // namespace
}  // namespace epmoe
