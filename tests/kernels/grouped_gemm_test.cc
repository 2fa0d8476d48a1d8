// Topology: one caller thread with a budget of 2 compute threads and of 1,
// both schedules (balanced: groups above M / threads rows on all threads, the
// rest one per thread; and one group at a time). Group sizes are ragged:
// empty groups, single-row groups, G = 1, all rows in one group, M = 0, and a
// mix of groups above and below the fair share. k = 33 and n = 19 are odd.
#include "kernels/grouped_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threading.h"
#include "kernels/gemm.h"
#include "reference.h"

namespace epmoe {
namespace {

using testing::kF32RelativeTolerance;
using testing::random_vector;
using testing::reference_gemm;
using testing::relative_error;
using testing::same_bits;

constexpr std::int64_t kInner = 33;   // forward k
constexpr std::int64_t kOutput = 19;  // forward n

struct GroupedCase {
  const char* name;
  std::vector<std::int64_t> group_sizes;
};

const std::vector<GroupedCase>& cases() {
  static const std::vector<GroupedCase> all = {
      {"ragged_with_empty", {3, 0, 1, 17, 0, 64, 5, 0}},
      {"single_group", {37}},
      {"all_rows_in_one_group", {0, 0, 50, 0}},
      {"no_rows", {0, 0, 0}},
      {"single_rows", {1, 1, 1, 1, 1}},
      {"hot_and_cold_groups", {300, 2, 0, 257, 9}},  // 300 > 568 / 2 rows
  };
  return all;
}

// Per-group double references for the three products.
struct GroupedReference {
  std::vector<double> out, dx, dw;
};

GroupedReference reference(const std::vector<std::int64_t>& sizes, const std::vector<float>& x,
                           const std::vector<float>& w, const std::vector<float>& dout) {
  const auto num_groups = static_cast<std::int64_t>(sizes.size());
  const std::int64_t rows = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  GroupedReference ref{std::vector<double>(rows * kOutput), std::vector<double>(rows * kInner),
                       std::vector<double>(num_groups * kInner * kOutput)};
  std::int64_t row = 0;
  for (std::int64_t g = 0; g < num_groups; ++g) {
    const std::int64_t m = sizes[g];
    const float* w_g = w.data() + g * kInner * kOutput;
    const auto out = reference_gemm(x.data() + row * kInner, w_g, nullptr, m, kOutput, kInner, false, false);
    const auto dx = reference_gemm(dout.data() + row * kOutput, w_g, nullptr, m, kInner, kOutput, false, true);
    const auto dw =
        reference_gemm(x.data() + row * kInner, dout.data() + row * kOutput, nullptr, kInner, kOutput, m, true, false);
    std::copy(out.c.begin(), out.c.end(), ref.out.begin() + row * kOutput);
    std::copy(dx.c.begin(), dx.c.end(), ref.dx.begin() + row * kInner);
    std::copy(dw.c.begin(), dw.c.end(), ref.dw.begin() + g * kInner * kOutput);
    row += m;
  }
  return ref;
}

class GroupedGemmTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    saved_threads_ = compute_threads();
    set_compute_threads(GetParam());
  }
  void TearDown() override { set_compute_threads(saved_threads_); }
  int saved_threads_ = 1;
};

TEST_P(GroupedGemmTest, F32MatchesPerGroupDoubleReference) {
  for (const GroupedCase& test_case : cases())
    for (GroupSchedule schedule : {GroupSchedule::balanced, GroupSchedule::one_group_at_a_time}) {
      SCOPED_TRACE(test_case.name);
      SCOPED_TRACE(schedule == GroupSchedule::balanced ? "balanced" : "one_group_at_a_time");
      const auto& sizes = test_case.group_sizes;
      const auto num_groups = static_cast<std::int64_t>(sizes.size());
      const std::int64_t rows = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
      const auto x = random_vector(rows * kInner, 1);
      const auto w = random_vector(num_groups * kInner * kOutput, 2);
      const auto dout = random_vector(rows * kOutput, 3);
      const auto dx_in = random_vector(rows * kInner, 4);
      const GroupedReference ref = reference(sizes, x, w, dout);
      const GroupedGemmShape shape{.group_sizes = sizes, .k = kInner, .n = kOutput, .schedule = schedule};

      std::vector<float> out(rows * kOutput, NAN), dx(rows * kInner, NAN);
      std::vector<float> dw(num_groups * kInner * kOutput, NAN);  // garbage, incl. empty groups
      grouped_gemm_forward(shape, x.data(), w.data(), out.data());
      grouped_gemm_dlhs(shape, dout.data(), w.data(), dx.data());
      grouped_gemm_drhs(shape, x.data(), dout.data(), dw.data());
      EXPECT_LE(relative_error(out, ref.out), kF32RelativeTolerance);
      EXPECT_LE(relative_error(dx, ref.dx), kF32RelativeTolerance);
      EXPECT_LE(relative_error(dw, ref.dw), kF32RelativeTolerance);
      for (std::int64_t g = 0; g < num_groups; ++g) {
        if (sizes[g] != 0) continue;
        for (std::int64_t i = 0; i < kInner * kOutput; ++i)
          ASSERT_EQ(dw[g * kInner * kOutput + i], 0.0f) << "empty group " << g;
      }

      auto dx_accumulated = dx_in;
      grouped_gemm_dlhs(shape, dout.data(), w.data(), dx_accumulated.data(), /*accumulate=*/true);
      std::vector<double> dx_accumulated_ref(ref.dx.size());
      for (std::size_t i = 0; i < ref.dx.size(); ++i) dx_accumulated_ref[i] = ref.dx[i] + dx_in[i];
      EXPECT_LE(relative_error(dx_accumulated, dx_accumulated_ref), kF32RelativeTolerance);
    }
}

// bf16 operands: the bound of gemm_test.cc, 2u + u^2 + 2 k u32 relative to
// sum|a||b|; with uniform(-1, 1) data sum|a||b| per element is about k/4
// while max|ref| is about sqrt(k)/3, so 2e-2 relative is a safe, still
// failing-on-garbage tolerance at k <= 33.
TEST_P(GroupedGemmTest, Bf16WithinBound) {
  if (!bf16_gemm_supported()) GTEST_SKIP() << "this CPU has no oneDNN bf16 matmul";
  const std::vector<std::int64_t> sizes = {300, 0, 1, 40, 7};
  const auto num_groups = static_cast<std::int64_t>(sizes.size());
  const std::int64_t rows = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  const auto x = random_vector(rows * kInner, 5);
  const auto w = random_vector(num_groups * kInner * kOutput, 6);
  const auto dout = random_vector(rows * kOutput, 7);
  const GroupedReference ref = reference(sizes, x, w, dout);
  const GroupedGemmShape shape{.group_sizes = sizes, .k = kInner, .n = kOutput, .compute_dtype = ComputeDType::bf16};
  std::vector<float> out(rows * kOutput), dx(rows * kInner), dw(num_groups * kInner * kOutput, NAN);
  grouped_gemm_forward(shape, x.data(), w.data(), out.data());
  grouped_gemm_dlhs(shape, dout.data(), w.data(), dx.data());
  grouped_gemm_drhs(shape, x.data(), dout.data(), dw.data());
  EXPECT_LE(relative_error(out, ref.out), 2e-2);
  EXPECT_LE(relative_error(dx, ref.dx), 2e-2);
  EXPECT_LE(relative_error(dw, ref.dw), 2e-2);
  EXPECT_GT(relative_error(out, ref.out), 1e-5);  // bf16 operands really used
}

// Small groups run one per thread; their bf16 weight copies (k * n = 77,100
// elements) are above the conversion's parallel grain, which once made the
// nested conversion convert only half of each matrix.
TEST_P(GroupedGemmTest, Bf16SmallGroupsWithLargeWeights) {
  if (!bf16_gemm_supported()) GTEST_SKIP() << "this CPU has no oneDNN bf16 matmul";
  const std::vector<std::int64_t> sizes = {5, 3, 2, 0};
  const std::int64_t k = 257, n = 300;
  const auto num_groups = static_cast<std::int64_t>(sizes.size());
  const auto x = random_vector(10 * k, 8);
  const auto w = random_vector(num_groups * k * n, 9);
  std::vector<float> out(10 * n);
  grouped_gemm_forward({.group_sizes = sizes, .k = k, .n = n, .compute_dtype = ComputeDType::bf16}, x.data(), w.data(),
                       out.data());
  EXPECT_EQ(compute_threads(), GetParam());  // the workers' budget of 1 does not leak out
  std::vector<double> ref(10 * n);
  for (std::int64_t g = 0, row = 0; g < num_groups; row += sizes[g++]) {
    const auto out_g = reference_gemm(x.data() + row * k, w.data() + g * k * n, nullptr, sizes[g], n, k, false, false);
    std::copy(out_g.c.begin(), out_g.c.end(), ref.begin() + row * n);
  }
  EXPECT_LE(relative_error(out, ref), 2e-2);
}

// Per-group pointers: each group's W_g (and dW_g) in its own allocation,
// groups listed out of address order, must give exactly the contiguous
// form's bits (same kernels, same order), for every ragged case and both
// schedules, f32 and (where the CPU has it) bf16.
TEST_P(GroupedGemmTest, PerGroupPointersMatchContiguousBitForBit) {
  std::vector<ComputeDType> dtypes = {ComputeDType::f32};
  if (bf16_gemm_supported()) dtypes.push_back(ComputeDType::bf16);
  for (ComputeDType dtype : dtypes)
    for (const GroupedCase& test_case : cases())
      for (GroupSchedule schedule : {GroupSchedule::balanced, GroupSchedule::one_group_at_a_time}) {
        SCOPED_TRACE(test_case.name);
        SCOPED_TRACE(to_string(dtype));
        const auto& sizes = test_case.group_sizes;
        const auto num_groups = static_cast<std::int64_t>(sizes.size());
        const std::int64_t rows = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
        const std::int64_t matrix = kInner * kOutput;
        const auto x = random_vector(rows * kInner, 11);
        const auto w = random_vector(num_groups * matrix, 12);
        const auto dout = random_vector(rows * kOutput, 13);
        const auto dx_in = random_vector(rows * kInner, 14);
        const GroupedGemmShape shape{
            .group_sizes = sizes, .k = kInner, .n = kOutput, .compute_dtype = dtype, .schedule = schedule};

        std::vector<float> out(rows * kOutput), dx(rows * kInner), dw(num_groups * matrix, NAN);
        auto dx_accumulated = dx_in;
        grouped_gemm_forward(shape, x.data(), w.data(), out.data());
        grouped_gemm_dlhs(shape, dout.data(), w.data(), dx.data());
        grouped_gemm_dlhs(shape, dout.data(), w.data(), dx_accumulated.data(), /*accumulate=*/true);
        grouped_gemm_drhs(shape, x.data(), dout.data(), dw.data());

        // Separate copies, allocated in reverse group order.
        std::vector<std::vector<float>> w_copies(num_groups), dw_copies(num_groups);
        for (std::int64_t g = num_groups - 1; g >= 0; --g) {
          w_copies[g].assign(w.begin() + g * matrix, w.begin() + (g + 1) * matrix);
          dw_copies[g].assign(matrix, NAN);
        }
        std::vector<const float*> w_groups(num_groups);
        std::vector<float*> dw_groups(num_groups);
        for (std::int64_t g = 0; g < num_groups; ++g) {
          w_groups[g] = w_copies[g].data();
          dw_groups[g] = dw_copies[g].data();
        }
        std::vector<float> out_p(rows * kOutput), dx_p(rows * kInner);
        auto dx_accumulated_p = dx_in;
        grouped_gemm_forward(shape, x.data(), w_groups, out_p.data());
        grouped_gemm_dlhs(shape, dout.data(), w_groups, dx_p.data());
        grouped_gemm_dlhs(shape, dout.data(), w_groups, dx_accumulated_p.data(), /*accumulate=*/true);
        grouped_gemm_drhs(shape, x.data(), dout.data(), dw_groups);

        EXPECT_TRUE(same_bits(out.data(), out_p.data(), out.size()));
        EXPECT_TRUE(same_bits(dx.data(), dx_p.data(), dx.size()));
        EXPECT_TRUE(same_bits(dx_accumulated.data(), dx_accumulated_p.data(), dx.size()));
        for (std::int64_t g = 0; g < num_groups; ++g)
          EXPECT_TRUE(same_bits(dw.data() + g * matrix, dw_copies[g].data(), matrix)) << "group " << g;
      }
}

TEST_P(GroupedGemmTest, PerGroupPointersRefuseWrongCountOrNull) {
  const std::vector<std::int64_t> sizes = {2, 0, 3};
  const GroupedGemmShape shape{.group_sizes = sizes, .k = kInner, .n = kOutput};
  const auto x = random_vector(5 * kInner, 15);
  const auto w = random_vector(kInner * kOutput, 16);
  std::vector<float> out(5 * kOutput), dx(5 * kInner), dw(kInner * kOutput);
  const std::vector<const float*> two = {w.data(), w.data()};
  const std::vector<const float*> with_null = {w.data(), nullptr, w.data()};
  const std::vector<float*> dw_two = {dw.data(), dw.data()};
  EXPECT_THROW(grouped_gemm_forward(shape, x.data(), two, out.data()), InternalError);
  EXPECT_THROW(grouped_gemm_forward(shape, x.data(), with_null, out.data()), InternalError);
  EXPECT_THROW(grouped_gemm_dlhs(shape, out.data(), with_null, dx.data()), InternalError);
  EXPECT_THROW(grouped_gemm_drhs(shape, x.data(), out.data(), dw_two), InternalError);
}

// Row blocks (RowBlocking::always, so that this machine, where automatic
// never picks them, runs the task space too): group sizes at the block's
// edges (0, 1, B - 1, B, B + 1, 2B + 1) with odd k and n, f32 and (where the
// CPU has it) bf16, against the double reference, with and without a
// weight version (packed weights where oneDNN packs).
TEST_P(GroupedGemmTest, RowBlocksMatchDoubleReferenceAtBlockEdges) {
  constexpr std::int64_t b = kRowBlockRows;
  const std::vector<std::int64_t> sizes = {0, 1, b - 1, b, b + 1, 0, 2 * b + 1, 7};
  const auto num_groups = static_cast<std::int64_t>(sizes.size());
  const std::int64_t rows = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  const auto x = random_vector(rows * kInner, 21);
  const auto w = random_vector(num_groups * kInner * kOutput, 22);
  const auto dout = random_vector(rows * kOutput, 23);
  const auto dx_in = random_vector(rows * kInner, 24);
  const GroupedReference ref = reference(sizes, x, w, dout);
  std::vector<double> dx_accumulated_ref(ref.dx.size());
  for (std::size_t i = 0; i < ref.dx.size(); ++i) dx_accumulated_ref[i] = ref.dx[i] + dx_in[i];
  std::vector<ComputeDType> dtypes = {ComputeDType::f32};
  if (bf16_gemm_supported()) dtypes.push_back(ComputeDType::bf16);
  for (ComputeDType dtype : dtypes)
    for (std::uint64_t version : {std::uint64_t{0}, std::uint64_t{77}}) {
      SCOPED_TRACE(to_string(dtype) + " version " + std::to_string(version));
      const double tolerance = dtype == ComputeDType::f32 ? kF32RelativeTolerance : 2e-2;
      const GroupedGemmShape shape{.group_sizes = sizes,
                                   .k = kInner,
                                   .n = kOutput,
                                   .compute_dtype = dtype,
                                   .weight_version = version,
                                   .row_blocking = RowBlocking::always};
      std::vector<float> out(rows * kOutput, NAN), dx(rows * kInner, NAN);
      auto dx_accumulated = dx_in;
      grouped_gemm_forward(shape, x.data(), w.data(), out.data());
      grouped_gemm_dlhs(shape, dout.data(), w.data(), dx.data());
      grouped_gemm_dlhs(shape, dout.data(), w.data(), dx_accumulated.data(), /*accumulate=*/true);
      EXPECT_LE(relative_error(out, ref.out), tolerance);
      EXPECT_LE(relative_error(dx, ref.dx), tolerance);
      EXPECT_LE(relative_error(dx_accumulated, dx_accumulated_ref), tolerance);
      EXPECT_EQ(compute_threads(), GetParam());  // the workers' budget of 1 does not leak out
    }
  clear_gemm_weight_cache();
}

// Every row block runs on one thread, so its bits do not depend on how many
// threads the caller has (the per-group path's do: a hot group runs on all).
TEST(GroupedGemmRowBlocks, BitsDoNotDependOnTheThreadCount) {
  const std::vector<std::int64_t> sizes = {300, 2, 0, 129, 9};  // 300 rows: a team group of the per-group path
  const auto num_groups = static_cast<std::int64_t>(sizes.size());
  const std::int64_t rows = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  for (auto [k, n] : {std::pair<std::int64_t, std::int64_t>{257, 129}, {2048, 16}, {1024, 512}, {16, 2048}}) {
    SCOPED_TRACE("k=" + std::to_string(k) + " n=" + std::to_string(n));
    const auto x = random_vector(rows * k, 31);
    const auto w = random_vector(num_groups * k * n, 32);
    const auto dout = random_vector(rows * n, 33);
    const int saved_threads = compute_threads();
    std::vector<std::vector<float>> outs, dxs;
    for (int threads : {1, 2}) {
      set_compute_threads(threads);
      const GroupedGemmShape shape{.group_sizes = sizes, .k = k, .n = n, .row_blocking = RowBlocking::always};
      outs.emplace_back(rows * n);
      dxs.emplace_back(rows * k);
      grouped_gemm_forward(shape, x.data(), w.data(), outs.back().data());
      grouped_gemm_dlhs(shape, dout.data(), w.data(), dxs.back().data());
    }
    set_compute_threads(saved_threads);
    EXPECT_TRUE(same_bits(outs[0].data(), outs[1].data(), outs[0].size()));
    EXPECT_TRUE(same_bits(dxs[0].data(), dxs[1].data(), dxs[0].size()));
  }
}

// automatic picks row blocks exactly where oneDNN packs the block's weights:
// where it does not (every f32 shape on AVX2), automatic gives the
// per-group path's bits; where it does, the row blocks' bits.
TEST(GroupedGemmRowBlocks, AutomaticFollowsWhetherOneDnnPacks) {
  const std::vector<std::int64_t> sizes = {100, 0, 3, 65};
  const auto num_groups = static_cast<std::int64_t>(sizes.size());
  const std::int64_t rows = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  const std::int64_t k = 64, n = 48;
  const auto x = random_vector(rows * k, 41);
  const auto w = random_vector(num_groups * k * n, 42);
  auto forward = [&](RowBlocking blocking, std::uint64_t version) {
    std::vector<float> out(rows * n);
    grouped_gemm_forward({.group_sizes = sizes, .k = k, .n = n, .weight_version = version, .row_blocking = blocking},
                         x.data(), w.data(), out.data());
    return out;
  };
  const bool packs = gemm_packs_weights(kRowBlockRows, n, k, false, ComputeDType::f32);
  const GroupedGemmShape versioned{.group_sizes = sizes, .k = k, .n = n, .weight_version = 5};
  EXPECT_EQ(forward_uses_row_blocks(versioned), packs);
  EXPECT_FALSE(forward_uses_row_blocks({.group_sizes = sizes, .k = k, .n = n}));  // no version: nothing to pack
  const auto automatic = forward(RowBlocking::automatic, 5);
  const auto expected = forward(packs ? RowBlocking::always : RowBlocking::never, 5);
  EXPECT_TRUE(same_bits(automatic.data(), expected.data(), automatic.size())) << "packs=" << packs;
  clear_gemm_weight_cache();
}

// The row blocks' packed weights per version: a new version with new values
// in the same buffer is used (rebuilt), the same version is served from the
// cache (reused) where oneDNN packs.
TEST(GroupedGemmRowBlocks, PackedWeightsRebuiltForANewVersionReusedForTheSame) {
  clear_gemm_weight_cache();
  const std::vector<std::int64_t> sizes = {70, 5};
  const std::int64_t rows = 75, k = 40, n = 24;
  const auto x = random_vector(rows * k, 51);
  auto w = random_vector(2 * k * n, 52);
  std::vector<float> out(rows * n);
  auto run = [&](std::uint64_t version) {
    grouped_gemm_forward(
        {.group_sizes = sizes, .k = k, .n = n, .weight_version = version, .row_blocking = RowBlocking::always},
        x.data(), w.data(), out.data());
  };
  run(1);
  const GemmWeightCacheStats first = gemm_weight_cache_stats();
  // One per group's matrix (oneDNN's path asks for an entry even where it
  // packs nothing; EPMOE_F32_GEMM=openblas keeps none).
  if (f32_gemm_backend() == F32GemmBackend::onednn) {
    EXPECT_EQ(first.entries, 2);
  }
  run(1);
  const GemmWeightCacheStats second = gemm_weight_cache_stats();
  EXPECT_EQ(second.preparations, first.preparations);  // nothing packed again for the same version
  if (gemm_packs_weights(kRowBlockRows, n, k, false, ComputeDType::f32)) {
    EXPECT_GT(second.reuses, first.reuses);  // served from the packed layout
  }
  const auto new_w = random_vector(2 * k * n, 53);
  std::copy(new_w.begin(), new_w.end(), w.begin());  // same buffer, new values
  run(2);
  std::vector<double> expected(rows * n);
  for (std::int64_t g = 0, row = 0; g < 2; row += sizes[g++]) {
    const auto out_g = reference_gemm(x.data() + row * k, w.data() + g * k * n, nullptr, sizes[g], n, k, false, false);
    std::copy(out_g.c.begin(), out_g.c.end(), expected.begin() + row * n);
  }
  EXPECT_LE(relative_error(out, expected), kF32RelativeTolerance) << "the old version's weights were used";
  clear_gemm_weight_cache();
}

// The forward's f32 copies of W_g off the 32-byte grid (kernels/gemm.h,
// GemmArgs::b_version) in a grouped product: groups of 33, 0, 1, 31 and 32
// rows, k = 33, n = 255, 256, 257, W in one 64-byte aligned [G, k, n] array.
// A copy is made for a group of 32 rows or more whose W_g starts on the
// grid, from n = 256: none at n = 255; groups 0 and 4 at n = 256 (every
// W_g on the grid); group 0 only at n = 257 (W_4 starts 16 bytes off the
// grid, where oneDNN is already fast). Held: the unversioned product's bits,
// the double reference's f32 bound, one copy per version (the same version
// again: none; new values and a new version: copied again and used), and
// the bytes kept (a new version replaces, never adds).
TEST_P(GroupedGemmTest, OffGridWeightsKeepTheBitsAtGroupEdges) {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  const std::vector<std::int64_t> sizes = {33, 0, 1, 31, 32};
  const std::int64_t rows = 97, k = kInner;
  const bool onednn = f32_gemm_backend() == F32GemmBackend::onednn;  // OpenBLAS keeps nothing
  const auto x = random_vector(rows * k, 61);
  for (const auto& [n, copies] : {std::pair<std::int64_t, std::int64_t>{255, 0}, {256, 2}, {257, 1}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::int64_t elements = static_cast<std::int64_t>(sizes.size()) * k * n;
    const std::unique_ptr<float, Free> w_storage(
        static_cast<float*>(std::aligned_alloc(64, ((elements * sizeof(float) + 63) / 64) * 64)));
    float* w = w_storage.get();
    std::vector<float> plain(rows * n), versioned(rows * n);
    auto forward = [&](std::uint64_t version, std::vector<float>& out) {
      grouped_gemm_forward(
          {.group_sizes = sizes, .k = k, .n = n, .weight_version = version, .row_blocking = RowBlocking::never},
          x.data(), w, out.data());
    };
    clear_gemm_weight_cache();
    for (std::uint64_t version : {std::uint64_t{1}, std::uint64_t{2}}) {
      SCOPED_TRACE("version " + std::to_string(version));
      const auto values = random_vector(elements, 61 + version);
      std::copy(values.begin(), values.end(), w);  // the same buffer, new values
      forward(0, plain);
      const GemmWeightCacheStats before = gemm_weight_cache_stats();
      forward(version, versioned);
      const GemmWeightCacheStats after = gemm_weight_cache_stats();
      EXPECT_TRUE(same_bits(plain, versioned));
      std::vector<double> expected(rows * n);
      for (std::int64_t g = 0, row = 0; g < static_cast<std::int64_t>(sizes.size()); row += sizes[g++]) {
        const auto out_g = reference_gemm(x.data() + row * k, w + g * k * n, nullptr, sizes[g], n, k, false, false);
        std::copy(out_g.c.begin(), out_g.c.end(), expected.begin() + row * n);
      }
      EXPECT_LE(relative_error(versioned, expected), kF32RelativeTolerance);
      EXPECT_EQ(after.preparations - before.preparations, onednn ? copies : 0);
      EXPECT_EQ(after.bytes, onednn ? copies * k * n * static_cast<std::int64_t>(sizeof(float)) : 0);
      forward(version, versioned);  // the same version: served from the copies
      EXPECT_EQ(gemm_weight_cache_stats().preparations, after.preparations);
      EXPECT_TRUE(same_bits(plain, versioned));
    }
  }
  clear_gemm_weight_cache();
}

INSTANTIATE_TEST_SUITE_P(ComputeThreads, GroupedGemmTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace epmoe
