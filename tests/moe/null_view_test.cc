// The per-rank MoeLayer given a view with a null data pointer and elements,
// as any argument of forward / backward / begin_forward / begin_backward (an
// input, a weight, an output buffer): a UsageError naming the argument and
// its shape before anything reads or writes it (before: a segfault for x,
// dy; an InternalError for a weight; a null bias or extra_d_logits silently
// taken for absent). The layer stays usable, with the same bits.
// Single rank, N=37 H=16 F=12 E=6 K=2.
#include <gtest/gtest.h>

#include <epmoe/moe_layer.h>
#include "core/error.h"
#include "reference_moe.h"
#include "single_rank_layer.h"

namespace epmoe {
namespace {

using testing::same_bits;

struct NullCase {
  std::string name;     // the argument made null
  std::string message;  // "moe layer: x: null data pointer for a 37x16 view"
};

void PrintTo(const NullCase& c, std::ostream* os) { *os << c.name; }

// A null view of `t`'s shape (its dtype).
TensorView null_like(const Tensor& t) { return TensorView(static_cast<const void*>(nullptr), t.dtype(), t.shape()); }
MutableTensorView null_mutable_like(DType dtype, std::initializer_list<std::int64_t> shape) {
  return MutableTensorView(static_cast<void*>(nullptr), dtype, shape);
}

class MoeLayerNullView : public ::testing::TestWithParam<NullCase> {};

TEST_P(MoeLayerNullView, IsRefusedNamingTheArgumentAndLeavesTheLayerUsable) {
  const NullCase& c = GetParam();
  const testing::MoeProblem p = testing::make_problem(
      37, 16, 12, RouterConfig{.kind = RouterKind::softmax_topk, .num_experts = 6, .top_k = 2}, 5);
  const MoeLayerConfig config{.hidden = 16, .ffn = 12, .router = p.router};
  const MoeWeights w{p.gate, p.wi0, p.wi1, p.wo, {}};
  testing::SingleRankLayer reference(config), layer(config);
  const MoeForwardOutput want = reference.forward(p.x, w);
  const MoeGradients want_grads = reference.backward(p.dy);

  const auto refused = [&](auto&& call) {
    try {
      call();
      ADD_FAILURE() << "accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
  };
  MoeWeights weights = w;
  TensorView x = p.x;
  if (c.name == "x") x = null_like(p.x);
  if (c.name == "gate") weights.gate = null_like(p.gate);
  if (c.name == "wi0") weights.wi0 = null_like(p.wi0);
  if (c.name == "wi1") weights.wi1 = null_like(p.wi1);
  if (c.name == "wo") weights.wo = null_like(p.wo);
  if (c.name == "bias") weights.bias = null_like(p.bias);
  MoeForwardBuffers forward_buffers;
  if (c.name == "y") forward_buffers.y = null_mutable_like(DType::f32, {37, 16});
  if (c.name == "topk_ids") forward_buffers.topk_ids = null_mutable_like(DType::i32, {37, 2});
  if (c.name == "topk_weights") forward_buffers.topk_weights = null_mutable_like(DType::f32, {37, 2});
  const bool forward_side = c.name == "x" || c.name == "gate" || c.name == "wi0" || c.name == "wi1" || c.name == "wo" ||
                            c.name == "bias" || c.name == "y" || c.name == "topk_ids" || c.name == "topk_weights";
  if (forward_side) {
    refused([&] { layer.forward(x, weights, {}, forward_buffers); });
    if (forward_buffers.y.rank() == 0 && forward_buffers.topk_ids.rank() == 0 &&
        forward_buffers.topk_weights.rank() == 0) {
      refused([&] { MoeStep step = layer.begin_forward(x, weights); });  // the split-phase entry too
    }
  }
  const MoeForwardOutput out = layer.forward(p.x, w);
  EXPECT_TRUE(same_bits(out.y, want.y)) << "the forward after a refused call";

  if (!forward_side) {
    TensorView dy = p.dy, extra;
    if (c.name == "dy") dy = null_like(p.dy);
    if (c.name == "extra_d_logits") extra = TensorView(static_cast<const float*>(nullptr), {37, 6});
    MoeGradientBuffers buffers;
    if (c.name == "dx") buffers.dx = null_mutable_like(DType::f32, {37, 16});
    if (c.name == "dgate") buffers.dgate = null_mutable_like(DType::f32, {16, 6});
    if (c.name == "dwi0") buffers.dwi0 = null_mutable_like(DType::f32, {6, 16, 12});
    if (c.name == "dwi1") buffers.dwi1 = null_mutable_like(DType::f32, {6, 16, 12});
    if (c.name == "dwo") buffers.dwo = null_mutable_like(DType::f32, {6, 12, 16});
    refused([&] { layer.backward(dy, extra, buffers); });
  }
  const MoeGradients grads = layer.backward(p.dy);
  EXPECT_TRUE(same_bits(grads.dx, want_grads.dx)) << "the backward after a refused call";
  EXPECT_TRUE(same_bits(grads.dwo, want_grads.dwo)) << "the backward after a refused call";
}

INSTANTIATE_TEST_SUITE_P(
    EveryArgument, MoeLayerNullView,
    ::testing::Values(NullCase{"x", "moe layer: x: null data pointer for a 37x16 view"},
                      NullCase{"gate", "moe layer: gate: null data pointer for a 16x6 view"},
                      NullCase{"wi0", "moe layer: wi0: null data pointer for a 6x16x12 view"},
                      NullCase{"wi1", "moe layer: wi1: null data pointer for a 6x16x12 view"},
                      NullCase{"wo", "moe layer: wo: null data pointer for a 6x12x16 view"},
                      NullCase{"bias", "moe layer: bias: null data pointer for a view of 6 elements"},
                      NullCase{"y", "moe layer: output buffer y: null data pointer for a 37x16 view"},
                      NullCase{"topk_ids", "moe layer: output buffer topk_ids: null data pointer for a 37x2 view"},
                      NullCase{"topk_weights",
                               "moe layer: output buffer topk_weights: null data pointer for a 37x2 view"},
                      NullCase{"dy", "moe layer: dy: null data pointer for a 37x16 view"},
                      NullCase{"extra_d_logits", "moe layer: extra_d_logits: null data pointer for a 37x6 view"},
                      NullCase{"dx", "moe layer: output buffer dx: null data pointer for a 37x16 view"},
                      NullCase{"dgate", "moe layer: output buffer dgate: null data pointer for a 16x6 view"},
                      NullCase{"dwi0", "moe layer: output buffer dwi0: null data pointer for a 6x16x12 view"},
                      NullCase{"dwi1", "moe layer: output buffer dwi1: null data pointer for a 6x16x12 view"},
                      NullCase{"dwo", "moe layer: output buffer dwo: null data pointer for a 6x12x16 view"}),
    [](const ::testing::TestParamInfo<NullCase>& info) { return info.param.name; });

}  // namespace
}  // namespace epmoe
