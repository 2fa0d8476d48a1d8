#include "ep/local_dispatcher.h"

#include <cstring>

#include "core/error.h"

namespace epmoe::ep {

LocalDispatcher::LocalDispatcher(int num_experts, int num_chunks) : num_experts_(num_experts), num_chunks_(num_chunks) {
  EPMOE_CHECK_GE(num_experts, 1);
  EPMOE_CHECK_GE(num_chunks, 1);
  stats_.reset(num_experts);
}

void LocalDispatcher::start_forward(TensorView x, const RoutingView& routing) {
  x_ = x;
  routing_ = routing;
  y_ = Tensor(DType::f32, {x.dim(0), x.dim(1)});
  pair_of_row_.assign(static_cast<std::size_t>(num_chunks_), {});
  stats_.reset(num_experts_);
}

ExpertRows LocalDispatcher::receive_rows(int chunk) {
  ExpertRows rows = redispatch_rows(chunk);
  stats_.count_rows(rows, num_experts_);
  return rows;
}

ExpertRows LocalDispatcher::redispatch_rows(int chunk) {
  const ChunkRange range = chunk_range(routing_.num_tokens, num_chunks_, chunk);
  const int top_k = routing_.top_k;
  RowEntries entries;
  entries.reserve(static_cast<std::size_t>(range.size() * top_k));
  for (std::int64_t t = range.begin; t < range.end; ++t)
    for (int k = 0; k < top_k; ++k) {
      const std::int64_t pair = t * top_k + k;
      entries.add(routing_.topk_ids[pair], routing_.topk_weights[pair], t - range.begin, t);
    }
  std::vector<std::int64_t> entry_of_row;
  ExpertRows rows = build_expert_rows(x_.data<float>(), x_.dim(1), entries, num_experts_, range.size(), &entry_of_row);
  // Entries were added in pair order starting at range.begin * K.
  for (std::int64_t& e : entry_of_row) e += range.begin * top_k;
  pair_of_row_[static_cast<std::size_t>(chunk)] = std::move(entry_of_row);
  return rows;
}

void LocalDispatcher::send_outputs(int chunk, Tensor slot_outputs) {
  const ChunkRange range = chunk_range(routing_.num_tokens, num_chunks_, chunk);
  EPMOE_CHECK_EQ(slot_outputs.numel(), range.size() * y_.dim(1));
  if (slot_outputs.size_bytes() > 0)
    std::memcpy(y_.data<float>() + range.begin * y_.dim(1), slot_outputs.raw(),
                static_cast<std::size_t>(slot_outputs.size_bytes()));
}

Tensor LocalDispatcher::finish_forward() { return std::move(y_); }

void LocalDispatcher::start_backward(TensorView dy) {
  dy_ = dy;
  grads_ = {Tensor(DType::f32, {dy.dim(0), dy.dim(1)}), Tensor(DType::f32, {routing_.num_tokens, routing_.top_k})};
}

Tensor LocalDispatcher::receive_cotangents(int chunk) {
  const ChunkRange range = chunk_range(routing_.num_tokens, num_chunks_, chunk);
  const std::int64_t hidden = dy_.dim(1);
  Tensor slots(DType::f32, {range.size(), hidden});
  if (slots.size_bytes() > 0)
    std::memcpy(slots.raw(), dy_.data<float>() + range.begin * hidden, static_cast<std::size_t>(slots.size_bytes()));
  return slots;
}

void LocalDispatcher::send_gradients(int chunk, Tensor slot_dx, std::vector<float> row_dweights) {
  const ChunkRange range = chunk_range(routing_.num_tokens, num_chunks_, chunk);
  const std::int64_t hidden = grads_.dx.dim(1);
  EPMOE_CHECK_EQ(slot_dx.numel(), range.size() * hidden);
  if (slot_dx.size_bytes() > 0)
    std::memcpy(grads_.dx.data<float>() + range.begin * hidden, slot_dx.raw(),
                static_cast<std::size_t>(slot_dx.size_bytes()));
  const std::vector<std::int64_t>& pair_of_row = pair_of_row_[static_cast<std::size_t>(chunk)];
  EPMOE_CHECK_EQ(row_dweights.size(), pair_of_row.size());
  float* dw = grads_.d_topk_weights.data<float>();
  for (std::size_t r = 0; r < pair_of_row.size(); ++r) dw[pair_of_row[r]] = row_dweights[r];
}

DispatchGradients LocalDispatcher::finish_backward() { return std::move(grads_); }

}  // namespace epmoe::ep
