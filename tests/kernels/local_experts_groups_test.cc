// The local experts with per-group weight and gradient pointers (homes and
// replica slots in different buffers) against the contiguous form: forward,
// recompute and backward (first chunk and accumulate) must give the same
// bits. Topology: one caller thread, compute budgets 1 and 2; ragged groups
// with an empty one and a hot one; odd H and F.
#include "moe/local_experts.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/threading.h"
#include "reference.h"

namespace epmoe {
namespace {

using testing::random_vector;
using testing::same_bits;

constexpr std::int64_t kHidden = 37, kFfn = 21;

Tensor tensor_of(const std::vector<float>& values, Shape shape) {
  Tensor t(DType::f32, std::move(shape));
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

ep::ExpertRows make_rows(const std::vector<std::int64_t>& sizes, std::int64_t num_slots) {
  const std::int64_t rows = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  ep::ExpertRows out;
  out.x = tensor_of(random_vector(rows * kHidden, 21), {rows, kHidden});
  out.group_sizes = sizes;
  out.weights = random_vector(rows, 22);
  for (std::int64_t r = 0; r < rows; ++r) out.slot_of_row.push_back((r * 7) % num_slots);
  out.num_slots = num_slots;
  return out;
}

class LocalExpertsGroupsTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    saved_threads_ = compute_threads();
    set_compute_threads(GetParam());
  }
  void TearDown() override { set_compute_threads(saved_threads_); }
  int saved_threads_ = 1;
};

TEST_P(LocalExpertsGroupsTest, PerGroupPointersGiveContiguousBits) {
  const std::vector<std::int64_t> sizes = {9, 0, 40, 3, 1};  // 40 > 53 / 2: a team group
  const auto groups = static_cast<std::int64_t>(sizes.size());
  const std::int64_t num_slots = 23, matrix = kHidden * kFfn;
  const ep::ExpertRows rows = make_rows(sizes, num_slots);
  const auto wi0 = random_vector(groups * matrix, 1), wi1 = random_vector(groups * matrix, 2),
             wo = random_vector(groups * matrix, 3);
  const Tensor slot_dy = tensor_of(random_vector(num_slots * kHidden, 4), {num_slots, kHidden});
  const ExpertShape shape{kHidden, kFfn};

  // Contiguous: one chunk, then a second (accumulate) on the same rows.
  const LocalExpertWeights contiguous{wi0.data(), wi1.data(), wo.data()};
  ExpertActivations saved;
  const Tensor out = experts_forward(shape, rows, contiguous, saved);
  Tensor dwi0(DType::f32, {groups, kHidden, kFfn}), dwi1(DType::f32, {groups, kHidden, kFfn}),
      dwo(DType::f32, {groups, kFfn, kHidden});
  const ExpertGradients grads = experts_backward(shape, rows, contiguous, saved, slot_dy, dwi0, dwi1, dwo, false);
  experts_backward(shape, rows, contiguous, saved, slot_dy, dwi0, dwi1, dwo, /*accumulate=*/true);

  // Per group: homes (groups 0..2) in one buffer, "slots" (3, 4) each alone,
  // gradients each in its own buffer.
  std::vector<std::vector<float>> copies;
  copies.reserve(3 * groups + 3 * groups);
  LocalExpertWeights split;
  split.version = 7;
  auto place = [&](const std::vector<float>& src, std::vector<const float*>& dst) {
    copies.emplace_back(src.begin(), src.begin() + 3 * matrix);  // homes
    const float* homes = copies.back().data();
    for (std::int64_t g = 0; g < 3; ++g) dst.push_back(homes + g * matrix);
    for (std::int64_t g = groups - 1; g >= 3; --g) {
      copies.emplace_back(src.begin() + g * matrix, src.begin() + (g + 1) * matrix);
    }
    // Slots were copied in reverse order: the last copy is group 3.
    const std::size_t last = copies.size() - 1;
    for (std::int64_t g = 3; g < groups; ++g) dst.push_back(copies[last - (g - 3)].data());
  };
  place(wi0, split.wi0_groups);
  place(wi1, split.wi1_groups);
  place(wo, split.wo_groups);
  ExpertWeightGradients dw;
  for (std::int64_t g = 0; g < groups; ++g) {
    for (auto* list : {&dw.dwi0, &dw.dwi1, &dw.dwo}) {
      copies.emplace_back(matrix, 0.0f);
      list->push_back(copies.back().data());
    }
  }
  ExpertActivations saved_split;
  const Tensor out_split = experts_forward(shape, rows, split, saved_split);
  ASSERT_TRUE(same_bits(out.data<float>(), out_split.data<float>(), out.numel()));
  ASSERT_TRUE(same_bits(saved.mlpwo.data<float>(), saved_split.mlpwo.data<float>(), saved.mlpwo.numel()));
  const ExpertGradients grads_split = experts_backward(shape, rows, split, saved_split, slot_dy, dw, false);
  EXPECT_TRUE(same_bits(grads.slot_dx.data<float>(), grads_split.slot_dx.data<float>(), grads.slot_dx.numel()));
  EXPECT_EQ(grads.row_dweights, grads_split.row_dweights);
  experts_backward(shape, rows, split, saved_split, slot_dy, dw, /*accumulate=*/true);
  for (std::int64_t g = 0; g < groups; ++g) {
    SCOPED_TRACE("group " + std::to_string(g));
    EXPECT_TRUE(same_bits(dwi0.data<float>() + g * matrix, dw.dwi0[g], matrix));
    EXPECT_TRUE(same_bits(dwi1.data<float>() + g * matrix, dw.dwi1[g], matrix));
    EXPECT_TRUE(same_bits(dwo.data<float>() + g * matrix, dw.dwo[g], matrix));
  }
  // The sums really accumulated (the second chunk doubled them).
  EXPECT_NE(dwi0.data<float>()[0], 0.0f);

  // Recompute from per-group pointers: the forward's bits.
  ExpertActivations dropped;
  dropped.mlpwi_0 = saved_split.mlpwi_0.clone();
  recompute_activations(shape, rows, split, dropped);
  EXPECT_TRUE(same_bits(saved.mlpwi_1.data<float>(), dropped.mlpwi_1.data<float>(), saved.mlpwi_1.numel()));
  EXPECT_TRUE(same_bits(saved.mlpwo.data<float>(), dropped.mlpwo.data<float>(), saved.mlpwo.numel()));
}

TEST_P(LocalExpertsGroupsTest, WrongPointerCountsAreRefused) {
  const std::vector<std::int64_t> sizes = {2, 3};
  const ep::ExpertRows rows = make_rows(sizes, 4);
  const auto w = random_vector(2 * kHidden * kFfn, 5);
  const ExpertShape shape{kHidden, kFfn};
  LocalExpertWeights weights{w.data(), w.data(), w.data()};
  weights.wo_groups = {w.data()};  // one pointer for two groups
  ExpertActivations saved;
  EXPECT_THROW(experts_forward(shape, rows, weights, saved), InternalError);
  weights.wo_groups.clear();
  const Tensor out = experts_forward(shape, rows, weights, saved);
  const Tensor slot_dy = tensor_of(random_vector(4 * kHidden, 6), {4, kHidden});
  std::vector<float> g0(kHidden * kFfn), g1(kHidden * kFfn);
  const ExpertWeightGradients short_dw{{g0.data(), g1.data()}, {g0.data(), g1.data()}, {g0.data()}};
  EXPECT_THROW(experts_backward(shape, rows, weights, saved, slot_dy, short_dw, false), InternalError);
  Tensor wrong(DType::f32, {3, kHidden, kFfn}), right(DType::f32, {2, kHidden, kFfn});
  EXPECT_THROW(experts_backward(shape, rows, weights, saved, slot_dy, wrong, right, right, false), InternalError);
}

INSTANTIATE_TEST_SUITE_P(ComputeThreads, LocalExpertsGroupsTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace epmoe
