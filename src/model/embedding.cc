// Embedding forward (a row gather) and backward (a deterministic scatter-add).
#include "model/embedding.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/modelled_clock.h"
#include "core/threading.h"

namespace epmoe {
namespace {

// Backward's unit of parallel work: 64 columns, a 256-byte run of a row.
constexpr std::int64_t kEmbeddingColumnBlock = 64;

// Checked serially, before any parallel region: an exception must not leave
// an OpenMP worker, and nothing is written when an id is bad.
void check_ids(const Tensor& ids, std::int64_t vocab) {
  EPMOE_CHECK(ids.dtype() == DType::i32);
  EPMOE_CHECK_EQ(ids.rank(), 1);
  const std::int32_t* id = ids.data<std::int32_t>();
  for (std::int64_t n = 0; n < ids.numel(); ++n) {
    EPMOE_CHECK_GE(id[n], 0);
    EPMOE_CHECK_LT(id[n], vocab);
  }
}

}  // namespace

void embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out) {
  const ComputeScope charge("embedding forward", {.bytes = 8.0 * out.numel()});
  EPMOE_CHECK(table.dtype() == DType::f32 && out.dtype() == DType::f32);
  EPMOE_CHECK_EQ(table.rank(), 2);
  EPMOE_CHECK_EQ(out.rank(), 2);
  const std::int64_t vocab = table.dim(0), hidden = table.dim(1), num_tokens = ids.numel();
  check_ids(ids, vocab);
  EPMOE_CHECK_EQ(out.dim(0), num_tokens);
  EPMOE_CHECK_EQ(out.dim(1), hidden);
  if (num_tokens == 0 || hidden == 0) return;
  const float* tp = table.data<float>();
  const std::int32_t* id = ids.data<std::int32_t>();
  float* op = out.data<float>();
  const std::int64_t grain = std::max<std::int64_t>(1, kElementwiseGrain / hidden);
  parallel_for(num_tokens, grain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t n = begin; n < end; ++n)
      std::memcpy(op + n * hidden, tp + std::int64_t{id[n]} * hidden, sizeof(float) * hidden);
  });
}

// After zeroing, the table's columns are cut into blocks of kEmbeddingColumnBlock at
// fixed offsets; a thread takes whole blocks and walks all tokens in order,
// adding their part of the block. No two threads touch the same element, and
// each element's sum runs in token order whatever the thread count.
void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table) {
  const ComputeScope charge("embedding backward", {.bytes = 12.0 * d_out.numel()});
  EPMOE_CHECK(d_out.dtype() == DType::f32 && d_table.dtype() == DType::f32);
  EPMOE_CHECK_EQ(d_table.rank(), 2);
  EPMOE_CHECK_EQ(d_out.rank(), 2);
  const std::int64_t vocab = d_table.dim(0), hidden = d_table.dim(1), num_tokens = ids.numel();
  check_ids(ids, vocab);
  EPMOE_CHECK_EQ(d_out.dim(0), num_tokens);
  EPMOE_CHECK_EQ(d_out.dim(1), hidden);
  d_table.fill_zero();
  if (num_tokens == 0 || hidden == 0) return;
  const float* gp = d_out.data<float>();
  const std::int32_t* id = ids.data<std::int32_t>();
  float* dp = d_table.data<float>();
  const std::int64_t num_blocks = (hidden + kEmbeddingColumnBlock - 1) / kEmbeddingColumnBlock;
  // A block costs one add per token and column.
  const std::int64_t grain = std::max<std::int64_t>(1, kElementwiseGrain / (num_tokens * kEmbeddingColumnBlock));
  parallel_for(num_blocks, grain, [&](std::int64_t first, std::int64_t last) {
    const std::int64_t begin = first * kEmbeddingColumnBlock;
    const std::int64_t end = std::min(hidden, last * kEmbeddingColumnBlock);
    for (std::int64_t n = 0; n < num_tokens; ++n) {
      const float* src = gp + n * hidden;
      float* dst = dp + std::int64_t{id[n]} * hidden;
      for (std::int64_t j = begin; j < end; ++j) dst[j] += src[j];
    }
  });
}

}  // namespace epmoe
