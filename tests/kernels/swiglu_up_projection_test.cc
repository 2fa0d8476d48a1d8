// The fused up projection + SwiGLU (kernels/swiglu_up_projection.h: the
// concatenated product, and two products per task with the SwiGLU as the
// task's epilogue) against the unfused path they replace
// (grouped_gemm_forward with wi0, then with wi1, then swiglu_forward): h0,
// h1 and act must have the same bits.
// Topology: one caller thread with a budget of 1 and of 2 compute threads;
// H in {15, 16, 17}, F in {7, 8, 9, 16} (on this AVX2 CPU the probe fuses
// F = 16 and leaves 7, 8, 9 unfused: both paths are checked), and H = 256,
// F = 64 (a shape where oneDNN's two-thread bits depend on n); groups: none at all, only empty
// ones, a mix with an empty group and one above the fair share (run on all
// threads), equal groups (one thread each), and a 300-row group. Every
// group's matrices live in their own buffer (homes and replica slots at
// unrelated addresses). Also the concatenation cache
// (kernels/concatenated_weights.h): reused at an unchanged version, rebuilt
// in place at a new one, so a stale concatenation fails the bit checks.
#include "kernels/swiglu_up_projection.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/threading.h"
#include "kernels/concatenated_weights.h"
#include "kernels/gemm.h"
#include "kernels/swiglu.h"
#include "reference.h"

namespace epmoe {
namespace {

using testing::random_vector;
using testing::same_bits;

// A version no other test (or earlier case) used: buffers freed by one case
// may come back at the same address with other values in the next.
std::uint64_t fresh_version() {
  static std::atomic<std::uint64_t> next{1000};
  return next++;
}

// One [k, f] matrix per group, each in its own allocation.
struct GroupMatrices {
  std::vector<std::vector<float>> storage;
  std::vector<const float*> pointers;
  GroupMatrices(std::size_t groups, std::int64_t k, std::int64_t f, std::uint64_t seed) {
    storage.reserve(groups);
    for (std::size_t g = 0; g < groups; ++g) {
      storage.push_back(random_vector(k * f, seed + 31 * g));
      pointers.push_back(storage.back().data());
    }
  }
};

struct Outputs {
  std::vector<float> h0, h1, act;
};

Outputs unfused(const GroupedGemmShape& shape, const std::vector<float>& x, const GroupMatrices& wi0,
                const GroupMatrices& wi1, std::int64_t rows) {
  Outputs out{std::vector<float>(rows * shape.n), std::vector<float>(rows * shape.n),
              std::vector<float>(rows * shape.n)};
  grouped_gemm_forward(shape, x.data(), wi0.pointers, out.h0.data());
  grouped_gemm_forward(shape, x.data(), wi1.pointers, out.h1.data());
  swiglu_forward(out.h0.data(), out.h1.data(), out.act.data(), rows * shape.n);
  return out;
}

Outputs fused(const GroupedGemmShape& shape, const std::vector<float>& x, const GroupMatrices& wi0,
              const GroupMatrices& wi1, std::int64_t rows, bool with_act = true,
              UpProjection how = UpProjection::concatenated) {
  Outputs out{std::vector<float>(rows * shape.n, -1.0f), std::vector<float>(rows * shape.n, -1.0f),
              std::vector<float>(rows * shape.n, -1.0f)};
  grouped_swiglu_up_projection(shape, x.data(), wi0.pointers, wi1.pointers, out.h0.data(), out.h1.data(),
                               with_act ? out.act.data() : nullptr, how);
  return out;
}

struct GroupCase {
  const char* name;
  std::vector<std::int64_t> sizes;
};

const std::vector<GroupCase>& group_cases() {
  static const std::vector<GroupCase> cases = {
      {"no groups", {}},
      {"only empty groups", {0, 0, 0}},
      {"mixed, one above the fair share", {5, 0, 40, 1, 3}},
      {"equal groups", {16, 16, 16, 16}},
      {"one large group and a small one", {300, 2}},
  };
  return cases;
}

// (compute threads, H, F, compute dtype)
using Param = std::tuple<int, std::int64_t, std::int64_t, ComputeDType>;

class SwigluUpProjectionTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    saved_threads_ = compute_threads();
    set_compute_threads(std::get<0>(GetParam()));
    if (std::get<3>(GetParam()) == ComputeDType::bf16 && !bf16_gemm_supported())
      GTEST_SKIP() << "this CPU has no oneDNN bf16 matmul";
  }
  void TearDown() override { set_compute_threads(saved_threads_); }
  int saved_threads_ = 1;
};

TEST_P(SwigluUpProjectionTest, FusedGivesTheUnfusedBits) {
  const auto [threads, hidden, ffn, dtype] = GetParam();
  for (const GroupCase& c : group_cases()) {
    SCOPED_TRACE(c.name);
    const std::int64_t rows = std::accumulate(c.sizes.begin(), c.sizes.end(), std::int64_t{0});
    const std::vector<float> x = random_vector(rows * hidden, 3);
    const GroupMatrices wi0(c.sizes.size(), hidden, ffn, 100), wi1(c.sizes.size(), hidden, ffn, 200);
    const GroupedGemmShape shape{
        .group_sizes = c.sizes, .k = hidden, .n = ffn, .compute_dtype = dtype, .weight_version = fresh_version()};
    const Outputs want = unfused(shape, x, wi0, wi1, rows);
    const std::int64_t builds_before = concatenated_weight_cache_stats().builds;
    const Outputs got = fused(shape, x, wi0, wi1, rows);
    // Where the probe allows it, the concatenation really ran (a one-thread
    // group with rows exists in every case with rows).
    if (rows > 0 && fused_up_projection_keeps_bits(hidden, ffn, dtype)) {
      EXPECT_GT(concatenated_weight_cache_stats().builds, builds_before);
    }
    EXPECT_TRUE(same_bits(want.h0, got.h0));
    EXPECT_TRUE(same_bits(want.h1, got.h1));
    EXPECT_TRUE(same_bits(want.act, got.act));
    // Without act: h0 and h1 alone, act untouched.
    const Outputs no_act = fused(shape, x, wi0, wi1, rows, /*with_act=*/false);
    EXPECT_TRUE(same_bits(want.h0, no_act.h0));
    EXPECT_TRUE(same_bits(want.h1, no_act.h1));
    EXPECT_TRUE(same_bits(no_act.act, std::vector<float>(rows * ffn, -1.0f)));
    // Version 0 (nothing to key a concatenation on) takes the unfused path: same bits.
    GroupedGemmShape unknown = shape;
    unknown.weight_version = 0;
    EXPECT_TRUE(same_bits(want.act, fused(unknown, x, wi0, wi1, rows).act));
  }
}

// UpProjection::two_products (the layer's default): both products in each
// of the forward's tasks and the SwiGLU as the task's epilogue give the bits
// of two grouped products and a SwiGLU pass, on the per-group path and in
// row blocks (RowBlocking::always: blocks of kRowBlockRows rows, groups of
// 0, 1, block - 1, block, block + 1 and 2 blocks + 1 rows), h0 and h1 within
// the f32 bound of the double reference; without act, act is untouched.
TEST_P(SwigluUpProjectionTest, TwoProductsWithTheSwigluAsEpilogueKeepTheBits) {
  const auto [threads, hidden, ffn, dtype] = GetParam();
  const std::vector<std::int64_t> block_edges = {
      0, 1, kRowBlockRows - 1, kRowBlockRows, 0, kRowBlockRows + 1, 2 * kRowBlockRows + 1};
  std::vector<GroupCase> cases = group_cases();
  cases.push_back({"block edges", block_edges});
  for (const GroupCase& c : cases) {
    for (RowBlocking blocking : {RowBlocking::never, RowBlocking::always}) {
      SCOPED_TRACE(std::string(c.name) + (blocking == RowBlocking::always ? ", row blocks" : ", per group"));
      const std::int64_t rows = std::accumulate(c.sizes.begin(), c.sizes.end(), std::int64_t{0});
      const std::vector<float> x = random_vector(rows * hidden, 9);
      const GroupMatrices wi0(c.sizes.size(), hidden, ffn, 500), wi1(c.sizes.size(), hidden, ffn, 600);
      const GroupedGemmShape shape{.group_sizes = c.sizes,
                                   .k = hidden,
                                   .n = ffn,
                                   .compute_dtype = dtype,
                                   .weight_version = fresh_version(),
                                   .row_blocking = blocking};
      const Outputs want = unfused(shape, x, wi0, wi1, rows);
      const Outputs got = fused(shape, x, wi0, wi1, rows, /*with_act=*/true, UpProjection::two_products);
      EXPECT_TRUE(same_bits(want.h0, got.h0));
      EXPECT_TRUE(same_bits(want.h1, got.h1));
      EXPECT_TRUE(same_bits(want.act, got.act));
      const Outputs no_act = fused(shape, x, wi0, wi1, rows, /*with_act=*/false, UpProjection::two_products);
      EXPECT_TRUE(same_bits(want.h0, no_act.h0));
      EXPECT_TRUE(same_bits(no_act.act, std::vector<float>(rows * ffn, -1.0f)));
      if (dtype == ComputeDType::f32) {
        std::int64_t row = 0;
        for (std::size_t g = 0; g < c.sizes.size(); ++g) {
          const std::int64_t m = c.sizes[g];
          for (const auto& [w, h] : {std::pair{&wi0, &got.h0}, std::pair{&wi1, &got.h1}}) {
            const auto ref =
                testing::reference_gemm(x.data() + row * hidden, w->pointers[g], nullptr, m, ffn, hidden, false, false);
            const std::vector<float> part(h->begin() + row * ffn, h->begin() + (row + m) * ffn);
            EXPECT_LE(testing::relative_error(part, ref.c), testing::kF32RelativeTolerance) << "group " << g;
          }
          row += m;
        }
      }
    }
  }
}

TEST_P(SwigluUpProjectionTest, NewVersionRebuildsTheConcatenation) {
  const auto [threads, hidden, ffn, dtype] = GetParam();
  if (!fused_up_projection_keeps_bits(hidden, ffn, dtype))
    GTEST_SKIP() << "not fused at this shape on this CPU (its concatenated product has other bits)";
  const std::vector<std::int64_t> sizes = {7, 0, 9, 8};
  const std::int64_t rows = 24;
  const std::vector<float> x = random_vector(rows * hidden, 5);
  GroupMatrices wi0(sizes.size(), hidden, ffn, 300), wi1(sizes.size(), hidden, ffn, 400);
  GroupedGemmShape shape{
      .group_sizes = sizes, .k = hidden, .n = ffn, .compute_dtype = dtype, .weight_version = fresh_version()};
  ASSERT_TRUE(same_bits(unfused(shape, x, wi0, wi1, rows).act, fused(shape, x, wi0, wi1, rows).act));
  // The optimizer's step: new values in the same buffers, and a new version.
  for (auto& m : wi0.storage)
    for (float& v : m) v = 0.5f * v + 0.25f;
  for (auto& m : wi1.storage)
    for (float& v : m) v = -v;
  shape.weight_version = fresh_version();
  const std::int64_t builds_before = concatenated_weight_cache_stats().builds;
  const Outputs want = unfused(shape, x, wi0, wi1, rows);
  const Outputs got = fused(shape, x, wi0, wi1, rows);
  EXPECT_TRUE(same_bits(want.h0, got.h0));
  EXPECT_TRUE(same_bits(want.h1, got.h1));
  EXPECT_TRUE(same_bits(want.act, got.act));
  EXPECT_GT(concatenated_weight_cache_stats().builds, builds_before);  // rebuilt, not reused
}

// Which shapes fuse is the CPU's business, but the probe must allow some:
// else the fused path would be dead code on this machine.
TEST(SwigluUpProjection, ProbeFusesSomeCommonWidth) {
  if (f32_gemm_backend() == F32GemmBackend::openblas) {
    EXPECT_FALSE(fused_up_projection_keeps_bits(64, 512, ComputeDType::f32));  // never fused on OpenBLAS
    return;
  }
  bool any = false;
  for (std::int64_t f : {9, 16, 64, 512}) any = any || fused_up_projection_keeps_bits(64, f, ComputeDType::f32);
  EXPECT_TRUE(any);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [threads, hidden, ffn, dtype] = info.param;
  return "threads" + std::to_string(threads) + "_H" + std::to_string(hidden) + "_F" + std::to_string(ffn) + "_" +
         to_string(dtype);
}

INSTANTIATE_TEST_SUITE_P(OddAndEvenShapes, SwigluUpProjectionTest,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(15, 16, 17),
                                            ::testing::Values(7, 8, 9, 16),
                                            ::testing::Values(ComputeDType::f32, ComputeDType::bf16)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(TwoThreadBitsDependOnN, SwigluUpProjectionTest,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(256), ::testing::Values(64),
                                            ::testing::Values(ComputeDType::f32, ComputeDType::bf16)),
                         param_name);

TEST(SwigluUpProjection, RefusesWrongPointerCountOrNull) {
  const std::vector<std::int64_t> sizes = {2, 3};
  const std::vector<float> x = random_vector(5 * 4, 1), w = random_vector(4 * 3, 2);
  std::vector<float> h0(15), h1(15), act(15);
  const GroupedGemmShape shape{.group_sizes = sizes, .k = 4, .n = 3, .weight_version = fresh_version()};
  const std::vector<const float*> two = {w.data(), w.data()}, one = {w.data()}, with_null = {w.data(), nullptr};
  EXPECT_THROW(grouped_swiglu_up_projection(shape, x.data(), one, two, h0.data(), h1.data(), act.data(),
                                            UpProjection::concatenated),
               InternalError);
  EXPECT_THROW(grouped_swiglu_up_projection(shape, x.data(), two, with_null, h0.data(), h1.data(), act.data(),
                                            UpProjection::concatenated),
               InternalError);
}

TEST(ConcatenatedWeights, RowsSideBySideReusedAtAVersionRebuiltInPlaceAtANewOne) {
  constexpr std::int64_t k = 5, n = 3;
  std::vector<float> w0 = random_vector(k * n, 7), w1 = random_vector(k * n, 8);
  const std::vector<const float*> first = {w0.data()}, second = {w1.data()};
  auto expect_concatenation = [&](const float* got) {
    for (std::int64_t i = 0; i < k; ++i) {
      EXPECT_EQ(std::memcmp(got + i * 2 * n, w0.data() + i * n, sizeof(float) * n), 0) << "row " << i;
      EXPECT_EQ(std::memcmp(got + i * 2 * n + n, w1.data() + i * n, sizeof(float) * n), 0) << "row " << i;
    }
  };
  const std::uint64_t version = fresh_version();
  const ConcatenatedWeightCacheStats before = concatenated_weight_cache_stats();
  const ConcatenatedWeights built = concatenated_weights(first, second, k, n, version);
  ASSERT_EQ(built.groups.size(), 1u);
  expect_concatenation(built.groups[0]);
  const ConcatenatedWeights again = concatenated_weights(first, second, k, n, version);
  const ConcatenatedWeightCacheStats after_reuse = concatenated_weight_cache_stats();
  EXPECT_EQ(again.groups[0], built.groups[0]);
  EXPECT_EQ(after_reuse.builds - before.builds, 1);  // no copy at an unchanged version
  EXPECT_EQ(after_reuse.reuses - before.reuses, 1);
  for (float& v : w0) v += 1.0f;
  const ConcatenatedWeights rebuilt = concatenated_weights(first, second, k, n, fresh_version());
  EXPECT_EQ(rebuilt.groups[0], built.groups[0]);  // in place: no new pages
  expect_concatenation(rebuilt.groups[0]);
  EXPECT_EQ(concatenated_weight_cache_stats().builds - before.builds, 2);
  EXPECT_TRUE(concatenated_weights({}, {}, k, n, version).groups.empty());
  EXPECT_THROW(concatenated_weights(first, second, k, n, 0), InternalError);
  const std::vector<const float*> null_group = {nullptr};
  EXPECT_THROW(concatenated_weights(null_group, second, k, n, fresh_version()), InternalError);
}

TEST(ConcatenatedWeights, ClearDropsEveryEntry) {
  const std::vector<float> w = random_vector(6, 9);
  const std::vector<const float*> groups = {w.data()};
  concatenated_weights(groups, groups, 2, 3, fresh_version());
  EXPECT_GE(concatenated_weight_cache_stats().entries, 1);
  EXPECT_GE(concatenated_weight_cache_stats().bytes, static_cast<std::int64_t>(sizeof(float)) * 12);
  clear_concatenated_weight_cache();
  EXPECT_EQ(concatenated_weight_cache_stats().entries, 0);
  EXPECT_EQ(concatenated_weight_cache_stats().bytes, 0);
}

}  // namespace
}  // namespace epmoe
