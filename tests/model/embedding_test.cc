// Embedding lookup and its scatter-add gradient. Topology: one caller; V = 6
// rows, H = 5, N = 9 tokens with ids repeated (row 2 three times, row 0
// twice, row 4 never) for the numerics; N = 512, V = 50, H = 256 (many
// repeats, several parallel grains) for the thread-budget test.
#include "model/embedding.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model_test_util.h"

namespace epmoe {
namespace {

using testing::kF32RelativeTolerance;
using testing::relative_error;

const std::vector<std::int32_t> kIds = {2, 0, 2, 5, 1, 0, 2, 3, 5};

std::vector<double> reference_forward(const std::vector<double>& table, const std::vector<std::int32_t>& ids,
                                      std::int64_t hidden) {
  std::vector<double> out(ids.size() * hidden);
  for (std::size_t n = 0; n < ids.size(); ++n)
    for (std::int64_t j = 0; j < hidden; ++j) out[n * hidden + j] = table[ids[n] * hidden + j];
  return out;
}

std::vector<double> reference_backward(const std::vector<std::int32_t>& ids, const std::vector<double>& d_out,
                                       std::int64_t vocab, std::int64_t hidden) {
  std::vector<double> d_table(vocab * hidden, 0.0);
  for (std::size_t n = 0; n < ids.size(); ++n)
    for (std::int64_t j = 0; j < hidden; ++j) d_table[ids[n] * hidden + j] += d_out[n * hidden + j];
  return d_table;
}

TEST(Embedding, ForwardGathersRows) {
  const std::int64_t vocab = 6, hidden = 5, n_tokens = static_cast<std::int64_t>(kIds.size());
  const Tensor table = testing::random_tensor({vocab, hidden}, 1);
  Tensor out = testing::nan_tensor({n_tokens, hidden});
  embedding_forward(table, testing::ids_tensor(kIds), out);
  const auto ref = reference_forward(testing::to_double(table), kIds, hidden);
  for (std::size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(out.data<float>()[i], ref[i]) << i;  // a copy: exact
}

TEST(Embedding, BackwardAccumulatesRepeatedIds) {
  const std::int64_t vocab = 6, hidden = 5, n_tokens = static_cast<std::int64_t>(kIds.size());
  const Tensor d_out = testing::random_tensor({n_tokens, hidden}, 2);
  Tensor d_table = testing::nan_tensor({vocab, hidden});  // overwritten, not accumulated into
  embedding_backward(testing::ids_tensor(kIds), d_out, d_table);
  const auto ref = reference_backward(kIds, testing::to_double(d_out), vocab, hidden);
  EXPECT_LE(relative_error(d_table, ref), kF32RelativeTolerance);
  // Row 2 is the sum of tokens 0, 2 and 6, in token order; row 4 (never hit) is zero.
  for (std::int64_t j = 0; j < hidden; ++j) {
    const float* g = d_out.data<float>();
    EXPECT_EQ(d_table.data<float>()[2 * hidden + j], (g[0 * hidden + j] + g[2 * hidden + j]) + g[6 * hidden + j]);
    EXPECT_EQ(d_table.data<float>()[4 * hidden + j], 0.0f);
  }
}

// embedding_backward is the gradient of sum(out * w) with respect to the
// table: central differences of the double forward.
TEST(Embedding, BackwardMatchesFiniteDifferences) {
  const std::int64_t vocab = 6, hidden = 5, n_tokens = static_cast<std::int64_t>(kIds.size());
  const Tensor table = testing::random_tensor({vocab, hidden}, 3);
  const Tensor w = testing::random_tensor({n_tokens, hidden}, 4);
  const auto wd = testing::to_double(w);
  const auto numeric = testing::numeric_gradient(testing::to_double(table), [&](const std::vector<double>& t) {
    return testing::dot(reference_forward(t, kIds, hidden), wd);
  });
  EXPECT_LE(relative_error(reference_backward(kIds, wd, vocab, hidden), numeric), testing::kFiniteDifferenceTolerance);
  Tensor d_table(DType::f32, {vocab, hidden});
  embedding_backward(testing::ids_tensor(kIds), w, d_table);
  EXPECT_LE(relative_error(d_table, numeric), kF32RelativeTolerance);
}

TEST(Embedding, BackwardBitIdenticalForOneAndTwoThreads) {
  const std::int64_t vocab = 50, hidden = 256, n_tokens = 512;
  Rng rng(5);
  std::vector<std::int32_t> ids(n_tokens);
  for (auto& id : ids) id = static_cast<std::int32_t>(rng.uniform_int(vocab));
  const Tensor ids_t = testing::ids_tensor(ids);
  const Tensor d_out = testing::random_tensor({n_tokens, hidden}, 6);
  auto run = [&](int threads) {
    testing::ScopedComputeThreads budget(threads);
    Tensor d_table(DType::f32, {vocab, hidden});
    embedding_backward(ids_t, d_out, d_table);
    return d_table;
  };
  const Tensor one = run(1), two = run(2);
  EXPECT_TRUE(testing::same_bits(one, two));
  EXPECT_LE(relative_error(one, reference_backward(ids, testing::to_double(d_out), vocab, hidden)),
            kF32RelativeTolerance);
}

TEST(Embedding, ZeroTokens) {
  const std::int64_t vocab = 4, hidden = 3;
  const Tensor table = testing::random_tensor({vocab, hidden}, 7);
  const Tensor ids(DType::i32, {0});
  Tensor out(DType::f32, {0, hidden});
  embedding_forward(table, ids, out);
  Tensor d_table = testing::nan_tensor({vocab, hidden});
  embedding_backward(ids, Tensor(DType::f32, {0, hidden}), d_table);
  for (float v : d_table.span<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(Embedding, OutOfRangeIdIsInternalError) {
  const std::int64_t vocab = 4, hidden = 3;
  const Tensor table = testing::random_tensor({vocab, hidden}, 8);
  for (std::int32_t bad : {-1, 4}) {
    const Tensor ids = testing::ids_tensor({0, bad});
    Tensor out = testing::nan_tensor({2, hidden});
    EXPECT_THROW(embedding_forward(table, ids, out), InternalError) << bad;
    // Checked before anything is written.
    for (float v : out.span<float>()) EXPECT_TRUE(std::isnan(v));
    Tensor d_table(DType::f32, {vocab, hidden});
    EXPECT_THROW(embedding_backward(ids, testing::random_tensor({2, hidden}, 9), d_table), InternalError) << bad;
  }
}

}  // namespace
}  // namespace epmoe
