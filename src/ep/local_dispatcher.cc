#include "ep/local_dispatcher.h"
#include "core/modelled_clock.h"

#include <cstring>

#include "core/error.h"

namespace epmoe::ep {

struct LocalDispatcher::Step final : StepState {
  struct Chunk {
    ChunkRange range;
    RowEntries entries;                     // the chunk's pairs, in (token, k) order
    std::vector<std::int64_t> pair_of_row;  // the (token, k) pair index of each expert row
    Tensor slot_outputs, slot_dx;           // the layer's, until the chunk's finish
    std::vector<float> row_dweights;

    std::int64_t capacity_bytes() const {
      return vector_capacity_bytes(entries.local_expert, entries.weight, entries.slot, entries.source_row, pair_of_row,
                                   row_dweights);
    }
  };
  std::vector<Chunk> chunks;

  std::int64_t capacity_bytes() const override {
    std::int64_t bytes = static_cast<std::int64_t>(chunks.capacity() * sizeof(Chunk));
    for (const Chunk& chunk : chunks) bytes += chunk.capacity_bytes();
    return bytes;
  }
};

// Nothing travels: no exchange buffers.
struct LocalDispatcher::Buffers final : PhaseBuffers {
  std::int64_t capacity_bytes() const override { return 0; }
};

LocalDispatcher::LocalDispatcher(const EpConfig& config) : Dispatcher(nullptr, config, 1, 0) {}

LocalDispatcher::~LocalDispatcher() = default;

std::unique_ptr<StepState> LocalDispatcher::make_step_state() const { return std::make_unique<Step>(); }

std::unique_ptr<PhaseBuffers> LocalDispatcher::make_phase_buffers() const { return std::make_unique<Buffers>(); }

void LocalDispatcher::begin_step(StepState& base, const RoutingView& routing) {
  Step& step = static_cast<Step&>(base);
  if (static_cast<int>(step.chunks.size()) < step.num_chunks) step.chunks.resize(step.num_chunks);
  const int top_k = routing.top_k, num_destinations = experts_per_rank();
  for (int c = 0; c < step.num_chunks; ++c) {
    Step::Chunk& chunk = step.chunks[c];
    chunk.range = chunk_range(routing.num_tokens, step.num_chunks, c);
    RowEntries& entries = chunk.entries;
    entries.local_expert.clear();
    entries.weight.clear();
    entries.slot.clear();
    entries.source_row.clear();
    entries.reserve(static_cast<std::size_t>(chunk.range.size() * top_k));
    for (std::int64_t t = chunk.range.begin; t < chunk.range.end; ++t)
      for (int k = 0; k < top_k; ++k) {
        const std::int64_t pair = t * top_k + k;
        const int destination = routing.destinations[pair];
        EPMOE_CHECK(destination >= 0 && destination < num_destinations, "destination of token ", t, ", k ", k, ": ",
                    destination, " is outside [0, ", num_destinations, ")");
        entries.add(destination, routing.topk_weights[pair], t - chunk.range.begin, t);
      }
  }
}

void LocalDispatcher::start_dispatch(StepState&, int, bool) {}

ExpertRows LocalDispatcher::collect_rows(StepState& base, int c, bool /*remat*/) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  ExpertRows rows = build_expert_rows(step.x.data<float>(), config().hidden, chunk.entries, experts_per_rank(),
                                      chunk.range.size(), &chunk.pair_of_row);
  // Entries were added in pair order starting at range.begin * K.
  for (std::int64_t& pair : chunk.pair_of_row) pair += chunk.range.begin * step.top_k;
  return rows;
}

void LocalDispatcher::start_combine(StepState& base, int c, Tensor slot_outputs) {
  Step::Chunk& chunk = static_cast<Step&>(base).chunks[c];
  EPMOE_CHECK_EQ(slot_outputs.numel(), chunk.range.size() * config().hidden);
  chunk.slot_outputs = std::move(slot_outputs);
}

void LocalDispatcher::finish_combine(StepState& base, int c, float* y) {
  Step::Chunk& chunk = static_cast<Step&>(base).chunks[c];
  const ComputeScope unpack("unpack rows", {.bytes = 2.0 * static_cast<double>(chunk.slot_outputs.size_bytes())});
  if (chunk.slot_outputs.size_bytes() > 0)
    std::memcpy(y + chunk.range.begin * config().hidden, chunk.slot_outputs.raw(),
                static_cast<std::size_t>(chunk.slot_outputs.size_bytes()));
  chunk.slot_outputs = Tensor();
}

void LocalDispatcher::start_cotangents(StepState&, int) {}

Tensor LocalDispatcher::collect_cotangents(StepState& base, int c) {
  const Step& step = static_cast<Step&>(base);
  const ChunkRange range = step.chunks[c].range;
  const std::int64_t hidden = config().hidden;
  Tensor slots(DType::f32, {range.size(), hidden});
  const ComputeScope pack("pack cotangents", {.bytes = 2.0 * static_cast<double>(slots.size_bytes())});
  if (slots.size_bytes() > 0)
    std::memcpy(slots.raw(), step.dy.data<float>() + range.begin * hidden,
                static_cast<std::size_t>(slots.size_bytes()));
  return slots;
}

void LocalDispatcher::start_gradients(StepState& base, int c, Tensor slot_dx, std::vector<float> row_dweights) {
  Step::Chunk& chunk = static_cast<Step&>(base).chunks[c];
  EPMOE_CHECK_EQ(slot_dx.numel(), chunk.range.size() * config().hidden);
  EPMOE_CHECK_EQ(row_dweights.size(), chunk.pair_of_row.size());
  chunk.slot_dx = std::move(slot_dx);
  chunk.row_dweights = std::move(row_dweights);
}

void LocalDispatcher::finish_gradients(StepState& base, int c, float* dx, float* d_topk_weights) {
  Step::Chunk& chunk = static_cast<Step&>(base).chunks[c];
  const ComputeScope unpack("unpack rows", {.bytes = 2.0 * static_cast<double>(chunk.slot_dx.size_bytes())});
  if (chunk.slot_dx.size_bytes() > 0)
    std::memcpy(dx + chunk.range.begin * config().hidden, chunk.slot_dx.raw(),
                static_cast<std::size_t>(chunk.slot_dx.size_bytes()));
  for (std::size_t r = 0; r < chunk.pair_of_row.size(); ++r)
    d_topk_weights[chunk.pair_of_row[r]] = chunk.row_dweights[r];
  chunk.slot_dx = Tensor();
}

}  // namespace epmoe::ep
