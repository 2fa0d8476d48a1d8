// A view with a null data pointer and elements, given to WholeWorldLayer as
// any one of its arrays or outputs, is refused with a UsageError naming the
// argument and its shape before anything reads or writes it (before: a
// segfault inside run()). A null view of no elements is an absent one.
// Ranks: threads (R = 2); N=8 H=4 F=6 E=4 K=2, zeros (the values do not
// matter: nothing may be computed).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include <epmoe/error.h>
#include <epmoe/whole_world_layer.h>

namespace epmoe {
namespace {

constexpr std::int64_t kN = 8, kH = 4, kF = 6, kE = 4, kK = 2;

struct Buffers {
  std::vector<float> x = std::vector<float>(kN * kH), gate = std::vector<float>(kH * kE),
                     wi0 = std::vector<float>(kE * kH * kF), wi1 = wi0, wo = wi0, bias = std::vector<float>(kE), dy = x,
                     y = x, weights = std::vector<float>(kN * kK), dx = x, dgate = gate, dwi0 = wi0, dwi1 = wi0,
                     dwo = wi0;
  std::vector<std::int32_t> ids = std::vector<std::int32_t>(kN * kK);
};

// The argument made null, and what the error must say.
struct NullCase {
  std::string name;     // gtest name
  std::string message;  // "LayerArrays::x: null data pointer for a 8x4 view"
};

void PrintTo(const NullCase& c, std::ostream* os) { *os << c.name; }

class NullView : public ::testing::TestWithParam<NullCase> {};

TEST_P(NullView, IsRefusedNamingTheArgumentBeforeAnyWork) {
  const NullCase& c = GetParam();
  Buffers b;
  // The pointer of the named argument, or the buffer's own.
  const auto data = [&](auto& buffer, const char* name) { return c.name == name ? nullptr : buffer.data(); };
  LayerArrays in{.x = TensorView(data(b.x, "x"), {kN, kH}),
                 .gate = TensorView(data(b.gate, "gate"), {kH, kE}),
                 .wi0 = TensorView(data(b.wi0, "wi0"), {kE, kH, kF}),
                 .wi1 = TensorView(data(b.wi1, "wi1"), {kE, kH, kF}),
                 .wo = TensorView(data(b.wo, "wo"), {kE, kF, kH}),
                 .dy = TensorView(data(b.dy, "dy"), {kN, kH})};
  if (c.name == "bias") in.bias = TensorView(static_cast<const float*>(nullptr), {kE});
  const LayerOutputs out{.y = MutableTensorView(data(b.y, "y"), {kN, kH}),
                         .topk_ids = MutableTensorView(data(b.ids, "topk_ids"), {kN, kK}),
                         .topk_weights = MutableTensorView(data(b.weights, "topk_weights"), {kN, kK}),
                         .dx = MutableTensorView(data(b.dx, "dx"), {kN, kH}),
                         .dgate = MutableTensorView(data(b.dgate, "dgate"), {kH, kE}),
                         .dwi0 = MutableTensorView(data(b.dwi0, "dwi0"), {kE, kH, kF}),
                         .dwi1 = MutableTensorView(data(b.dwi1, "dwi1"), {kE, kH, kF}),
                         .dwo = MutableTensorView(data(b.dwo, "dwo"), {kE, kF, kH})};
  WholeWorldLayer layer({{"ranks", "2"}, {"threads", "2"}, {"top_k", "2"}});
  try {
    layer.run(in, out);
    ADD_FAILURE() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
  }
  // Nothing was written (the buffers are zeros, the outputs of a run are not).
  for (const std::vector<float>* v : {&b.y, &b.weights, &b.dx, &b.dgate, &b.dwi0, &b.dwi1, &b.dwo}) {
    for (float value : *v) ASSERT_EQ(value, 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryArgument, NullView,
    ::testing::Values(NullCase{"x", "LayerArrays::x: null data pointer for a 8x4 view"},
                      NullCase{"gate", "LayerArrays::gate: null data pointer for a 4x4 view"},
                      NullCase{"wi0", "LayerArrays::wi0: null data pointer for a 4x4x6 view"},
                      NullCase{"wi1", "LayerArrays::wi1: null data pointer for a 4x4x6 view"},
                      NullCase{"wo", "LayerArrays::wo: null data pointer for a 4x6x4 view"},
                      NullCase{"bias", "LayerArrays::bias: null data pointer for a view of 4 elements"},
                      NullCase{"dy", "LayerArrays::dy: null data pointer for a 8x4 view"},
                      NullCase{"y", "LayerOutputs::y: null data pointer for a 8x4 view"},
                      NullCase{"topk_ids", "LayerOutputs::topk_ids: null data pointer for a 8x2 view"},
                      NullCase{"topk_weights", "LayerOutputs::topk_weights: null data pointer for a 8x2 view"},
                      NullCase{"dx", "LayerOutputs::dx: null data pointer for a 8x4 view"},
                      NullCase{"dgate", "LayerOutputs::dgate: null data pointer for a 4x4 view"},
                      NullCase{"dwi0", "LayerOutputs::dwi0: null data pointer for a 4x4x6 view"},
                      NullCase{"dwi1", "LayerOutputs::dwi1: null data pointer for a 4x4x6 view"},
                      NullCase{"dwo", "LayerOutputs::dwo: null data pointer for a 4x6x4 view"}),
    [](const ::testing::TestParamInfo<NullCase>& info) { return info.param.name; });

// A null view of no elements is an empty one, not an error: N = 0 tokens.
TEST(NullView, OfNoElementsIsAnEmptyArray) {
  Buffers b;
  const LayerArrays in{.x = TensorView(static_cast<const float*>(nullptr), {0, kH}),
                       .gate = TensorView(b.gate.data(), {kH, kE}),
                       .wi0 = TensorView(b.wi0.data(), {kE, kH, kF}),
                       .wi1 = TensorView(b.wi1.data(), {kE, kH, kF}),
                       .wo = TensorView(b.wo.data(), {kE, kF, kH})};
  const LayerOutputs out{.y = MutableTensorView(static_cast<float*>(nullptr), {0, kH}),
                         .topk_ids = MutableTensorView(static_cast<std::int32_t*>(nullptr), {0, kK}),
                         .topk_weights = MutableTensorView(static_cast<float*>(nullptr), {0, kK})};
  WholeWorldLayer layer({{"ranks", "2"}, {"threads", "2"}, {"top_k", "2"}});
  EXPECT_NO_THROW(layer.run(in, out));
}

}  // namespace
}  // namespace epmoe
