#include "ep/ring_dispatcher.h"

#include <cstring>

#include "comm/all_gather.h"
#include "comm/reduce_scatter.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "ep/collective_tags.h"

namespace epmoe::ep {

namespace {

// Scales every rank's count by `per_row` (rows -> elements).
std::vector<std::int64_t> times(const std::vector<std::int64_t>& rows, std::int64_t per_row) {
  std::vector<std::int64_t> out(rows.size());
  for (std::size_t r = 0; r < rows.size(); ++r) out[r] = rows[r] * per_row;
  return out;
}

// Bytes this rank sends in a bidirectional ring all-gather of these blocks
// (comm/ring.h): the clockwise lane forwards the first ceil(n/2) elements of
// every block but rank+1's, the other lane the rest of every block but rank-1's.
std::int64_t all_gather_bytes_sent(const std::vector<std::int64_t>& elements, int rank, std::int64_t element_bytes) {
  const int num_ranks = static_cast<int>(elements.size());
  if (num_ranks == 1) return 0;
  std::int64_t sent = 0;
  for (int b = 0; b < num_ranks; ++b) {
    if (b != (rank + 1) % num_ranks) sent += (elements[b] + 1) / 2;
    if (b != (rank + num_ranks - 1) % num_ranks) sent += elements[b] / 2;
  }
  return sent * element_bytes;
}

// A ring reduce-scatter sends a partial sum of every block but this rank's, as f32.
std::int64_t reduce_scatter_bytes_sent(const std::vector<std::int64_t>& elements, int rank) {
  std::int64_t sent = 0;
  for (std::size_t b = 0; b < elements.size(); ++b)
    if (static_cast<int>(b) != rank) sent += elements[b] * 4;
  return sent;
}

}  // namespace

// Chunks live as long as the dispatcher and their vectors keep their
// capacity from step to step (cleared, never freed), so a steady step takes
// no fresh pages (tests/ep/steady_state_test.cc).
struct RingDispatcher::Chunk {
  ChunkRange range;
  std::vector<std::int64_t> rows_by_rank;  // [R] this chunk's tokens on every rank
  std::vector<std::int64_t> slot_offset;   // [R] first slot of rank r's tokens
  std::int64_t num_slots = 0;              // sum of rows_by_rank
  float tensor_scale = 1.0f;
  // Per rank's block, one all-gather: its tokens' routing words (per token
  // K ids, then K weight bits), then its token rows (TokenCodec).
  std::vector<std::int32_t> local_routing;
  std::vector<std::byte> local_block, gathered_blocks;
  std::vector<const std::byte*> row_address;  // per slot: its token row in gathered_blocks
  comm::CollectiveHandle gather_in_flight;
  bool gather_started = false;
  std::vector<std::int64_t> entry_of_row;
  std::vector<std::int64_t> entry_slot_k;      // per entry: slot * K + k
  std::vector<std::int64_t> pairs_seen_start;  // replicas: [R * E] at this chunk's start
  bool positions_known = false;
  Tensor slot_outputs, y_chunk;
  comm::CollectiveHandle combine_in_flight;
  Tensor gathered_dy;
  comm::CollectiveHandle cotangent_in_flight;
  bool cotangent_started = false;
  Tensor slot_dx, dx_chunk, slot_dweights, dweights_chunk;
  comm::CollectiveHandle dx_in_flight, dweights_in_flight;

  void start_step(ChunkRange chunk_range) {
    range = chunk_range;
    rows_by_rank.clear();
    slot_offset.clear();
    num_slots = 0;
    gather_started = positions_known = cotangent_started = false;
    entry_slot_k.clear();
  }

  // The vectors' capacity: what the chunk holds across steps (its Tensors
  // are the step's).
  std::int64_t capacity_bytes() const {
    return vector_capacity_bytes(rows_by_rank, slot_offset, local_routing, local_block, gathered_blocks, row_address,
                                 entry_of_row, entry_slot_k, pairs_seen_start);
  }
};

RingDispatcher::RingDispatcher(transport::Communicator& comm, EpConfig config)
    : comm_(comm),
      config_(std::move(config)),
      num_local_experts_((config_.validate(comm.size()), config_.num_experts / comm.size())),
      codec_(config_.token_format, config_.hidden) {
  EPMOE_CHECK(config_.capacity_factor == 0.0, "the ring moves every token: capacity_factor is the all-to-all's");
  stats_.reset(num_local_experts_);
  if (config_.replicas_enabled()) replicas_ = std::make_unique<ReplicaExchange>(comm_, config_, &stats_.bytes_sent);
}

RingDispatcher::~RingDispatcher() = default;

void RingDispatcher::start_forward(TensorView x, const RoutingView& routing) {
  EPMOE_CHECK_EQ(routing.top_k, config_.top_k);
  EPMOE_CHECK_EQ(x.dim(1), config_.hidden);
  x_ = x;
  routing_ = routing;
  stats_.reset(num_local_experts_);
  if (config_.token_format == TokenFormat::fp8_tensor) {
    // Every chunk's scale in one all-gather, moving while the step plans:
    // R-1 blocks of num_chunks f32 maxima leave this rank.
    std::vector<std::int64_t> chunk_begin;
    for (int c = 0; c <= config_.num_chunks; ++c) chunk_begin.push_back(routing.num_tokens * c / config_.num_chunks);
    tensor_scales_.start(comm_, x.data<float>(), config_.hidden, std::move(chunk_begin),
                         ep_tag(config_.tag_base, 0, EpOp::forward_scale), config_.timeout);
    stats_.bytes_sent["forward/ring_all_gather fp8 scale"] += 4 * config_.num_chunks * (comm_.size() - 1);
  }
  const int num_ranks = comm_.size();
  tokens_by_rank_.assign(static_cast<std::size_t>(num_ranks), routing.num_tokens);
  if (num_ranks > 1) {
    const std::int64_t own = routing.num_tokens;
    comm::ring_all_gather(comm_, {.input = &own,
                                  .output = tokens_by_rank_.data(),
                                  .num_elements_per_rank = 1,
                                  .dtype = DType::i64,
                                  .tag = ep_tag(config_.tag_base, 1, EpOp::ring_token_counts),
                                  .timeout = config_.timeout})
        .wait();
  }
  stats_.bytes_sent["forward/ring_all_gather token counts"] += 8 * (num_ranks - 1);  // one i64 per other rank
  while (static_cast<int>(chunks_.size()) < config_.num_chunks) chunks_.push_back(std::make_unique<Chunk>());
  for (int c = 0; c < config_.num_chunks; ++c) {
    Chunk& chunk = *chunks_[c];
    chunk.start_step(chunk_range(routing.num_tokens, config_.num_chunks, c));
    for (int r = 0; r < num_ranks; ++r) {
      chunk.slot_offset.push_back(chunk.num_slots);
      chunk.rows_by_rank.push_back(chunk_range(tokens_by_rank_[r], config_.num_chunks, c).size());
      chunk.num_slots += chunk.rows_by_rank.back();
    }
  }
  if (replicas_) {
    ScopedPhase phase(stats_.phase_seconds, "balance");
    replicas_->plan_step(routing);
    pairs_seen_.assign(static_cast<std::size_t>(comm_.size()) * config_.num_experts, 0);
  }
  start_gather(0, /*remat=*/false);
}

// Starts chunk c's all-gather of tokens and their routing, one block per
// rank (the routing travels with the tokens: one ring, not two): in the
// forward, or again in the backward when x_sorted is recomputed (then the
// fp8 scale is reused).
void RingDispatcher::start_gather(int c, bool remat) {
  Chunk& chunk = *chunks_[c];
  chunk.gather_started = true;
  const int top_k = config_.top_k;
  const std::int64_t hidden = config_.hidden, n = chunk.range.size();
  if (config_.token_format == TokenFormat::fp8_tensor && !remat) chunk.tensor_scale = tensor_scales_.scale(c);
  const std::int64_t row_bytes = codec_.row_bytes(), routing_bytes = 8 * top_k;
  chunk.local_routing.resize(static_cast<std::size_t>(n * 2 * top_k));
  for (std::int64_t t = 0; t < n; ++t)
    for (int k = 0; k < top_k; ++k) {
      const std::int64_t pair = (chunk.range.begin + t) * top_k + k;
      chunk.local_routing[(t * 2) * top_k + k] = routing_.topk_ids[pair];
      std::memcpy(&chunk.local_routing[(t * 2 + 1) * top_k + k], &routing_.topk_weights[pair], 4);
    }
  chunk.local_block.resize(static_cast<std::size_t>(n * (routing_bytes + row_bytes)));
  if (n > 0) std::memcpy(chunk.local_block.data(), chunk.local_routing.data(), n * routing_bytes);
  codec_.encode(x_.data<float>() + chunk.range.begin * hidden, nullptr, n, chunk.tensor_scale,
                chunk.local_block.data() + n * routing_bytes);
  chunk.gathered_blocks.resize(static_cast<std::size_t>(chunk.num_slots * (routing_bytes + row_bytes)));
  const std::string prefix = remat ? "backward/remat " : "forward/";
  stats_.bytes_sent[prefix + "ring_all_gather tokens"] +=
      all_gather_bytes_sent(times(chunk.rows_by_rank, row_bytes), comm_.rank(), 1);
  stats_.bytes_sent[prefix + "ring_all_gather routing"] +=
      all_gather_bytes_sent(times(chunk.rows_by_rank, 2 * top_k), comm_.rank(), 4);
  chunk.gather_in_flight = comm::ring_all_gather(
      comm_, {.input = chunk.local_block.data(),
              .output = chunk.gathered_blocks.data(),
              .num_elements_by_rank = times(chunk.rows_by_rank, routing_bytes + row_bytes),
              .dtype = DType::fp8_e4m3,
              .tag = ep_tag(config_.tag_base, c, remat ? EpOp::remat_tokens : EpOp::forward_tokens),
              .timeout = config_.timeout});
}

ExpertRows RingDispatcher::receive_rows(int c) {
  if (!chunks_[c]->gather_started) start_gather(c, false);
  ExpertRows rows = collect_rows(c);
  if (c + 1 < config_.num_chunks && !chunks_[c + 1]->gather_started) start_gather(c + 1, false);
  stats_.count_rows(rows, num_local_experts_);
  if (replicas_) replicas_->count_slot_rows(rows);
  return rows;
}

ExpertRows RingDispatcher::redispatch_rows(int c) {
  start_gather(c, /*remat=*/true);
  return collect_rows(c);
}

// Waits for chunk c's gathers and keeps the rows routed to local experts.
ExpertRows RingDispatcher::collect_rows(int c) {
  Chunk& chunk = *chunks_[c];
  // Test hook (core/fault_injection.h): fail with the token all-gather in flight.
  fault_point("dispatch", comm_.rank());
  chunk.gather_in_flight.wait();

  // Rank r's block starts at its first slot times the bytes per token; its
  // routing words are read with memcpy (a block starts at any byte offset).
  const int top_k = config_.top_k;
  const std::int64_t num_slots = chunk.num_slots;
  const std::int64_t row_bytes = codec_.row_bytes(), routing_bytes = 8 * top_k;
  const std::byte* blocks = chunk.gathered_blocks.data();
  chunk.row_address.clear();
  for (int source = 0; source < comm_.size(); ++source) {
    const std::int64_t first_slot = chunk.slot_offset[source], rows = chunk.rows_by_rank[source];
    const std::byte* tokens = blocks + first_slot * (routing_bytes + row_bytes) + rows * routing_bytes;
    for (std::int64_t i = 0; i < rows; ++i) chunk.row_address.push_back(tokens + i * row_bytes);
  }
  // Word w of slot g's routing (g in source's block).
  auto routing_word = [&](int source, std::int64_t g, std::int64_t w) {
    std::int32_t word;
    std::memcpy(&word,
                blocks + chunk.slot_offset[source] * (routing_bytes + row_bytes) +
                    ((g - chunk.slot_offset[source]) * 2 * top_k + w) * 4,
                sizeof word);
    return word;
  };

  RowEntries entries;
  chunk.entry_slot_k.clear();
  const int first = first_local_expert();
  const int num_experts = config_.num_experts;
  std::vector<std::int64_t> seen;  // replicas: running pair counts per (source rank, expert)
  const bool first_collect = !chunk.positions_known;
  if (replicas_) {
    // The forward collects chunks in order; a remat re-collect starts where
    // the forward's did.
    if (!chunk.positions_known) {
      chunk.pairs_seen_start = pairs_seen_;
      chunk.positions_known = true;
    }
    seen = chunk.pairs_seen_start;
  }
  // Slot g of source rank `source`'s block: its tokens arrive in token order.
  for (int source = 0; source < comm_.size(); ++source) {
    const std::int64_t end = chunk.slot_offset[source] + chunk.rows_by_rank[source];
    for (std::int64_t g = chunk.slot_offset[source]; g < end; ++g) {
      for (int k = 0; k < top_k; ++k) {
        const std::int32_t expert = routing_word(source, g, k);
        int local = expert - first;
        if (replicas_) {
          // The positional rule, not the dedup-aware choice: this receiver
          // sees source chunks one at a time (the choice needs a source's
          // whole step), and the ring has no dedup to save rows on.
          const PairDestination dest =
              replicas_->destination(source, expert, seen[static_cast<std::size_t>(source) * num_experts + expert]++);
          if (dest.rank != comm_.rank()) continue;
          local = dest.local_expert;
        } else if (local < 0 || local >= num_local_experts_) {
          continue;
        }
        const std::int32_t weight_bits = routing_word(source, g, top_k + k);
        float weight;
        std::memcpy(&weight, &weight_bits, sizeof weight);
        entries.add(local, weight, g, g);
        chunk.entry_slot_k.push_back(g * top_k + k);
      }
    }
  }
  if (replicas_ && first_collect) pairs_seen_ = seen;
  ExpertRows rows = build_expert_rows(codec_, chunk.tensor_scale, chunk.row_address, entries, num_compute_experts(),
                                      num_slots, &chunk.entry_of_row);
  return rows;
}

void RingDispatcher::send_outputs(int c, Tensor slot_outputs) {
  Chunk& chunk = *chunks_[c];
  const std::int64_t n = chunk.range.size(), hidden = config_.hidden;
  EPMOE_CHECK_EQ(slot_outputs.numel(), chunk.num_slots * hidden, "expert outputs of chunk ", c,
                 ": one H-row per slot of the gathered tokens");
  chunk.slot_outputs = std::move(slot_outputs);
  chunk.y_chunk = Tensor(DType::f32, {n, hidden});
  const std::vector<std::int64_t> output_elements = times(chunk.rows_by_rank, hidden);
  stats_.bytes_sent["forward/reduce_scatter combine"] += reduce_scatter_bytes_sent(output_elements, comm_.rank());
  chunk.combine_in_flight = comm::reduce_scatter(comm_, {.input = chunk.slot_outputs.raw(),
                                                         .output = chunk.y_chunk.raw(),
                                                         .num_elements_per_rank = output_elements,
                                                         .tag = ep_tag(config_.tag_base, c, EpOp::forward_combine),
                                                         .timeout = config_.timeout});
}

Tensor RingDispatcher::finish_forward() {
  const std::int64_t hidden = config_.hidden;
  Tensor y(DType::f32, {routing_.num_tokens, hidden});
  for (auto& chunk : chunks_) {
    chunk->combine_in_flight.wait();
    if (chunk->y_chunk.size_bytes() > 0)
      std::memcpy(y.data<float>() + chunk->range.begin * hidden, chunk->y_chunk.raw(),
                  static_cast<std::size_t>(chunk->y_chunk.size_bytes()));
    chunk->slot_outputs = Tensor();
    chunk->y_chunk = Tensor();
  }
  return y;
}

void RingDispatcher::start_backward(TensorView dy) {
  dy_ = dy;
  if (config_.cotangent_all_gather == CotangentAllGather::ring) start_cotangent_gather(0);
}

void RingDispatcher::start_cotangent_gather(int c) {
  Chunk& chunk = *chunks_[c];
  chunk.cotangent_started = true;
  const std::int64_t hidden = config_.hidden;
  chunk.gathered_dy = Tensor(DType::f32, {chunk.num_slots, hidden});
  const std::vector<std::int64_t> dy_elements = times(chunk.rows_by_rank, hidden);
  stats_.bytes_sent["backward/ring_all_gather cotangent"] += all_gather_bytes_sent(dy_elements, comm_.rank(), 4);
  chunk.cotangent_in_flight =
      comm::ring_all_gather(comm_, {.input = dy_.data<float>() + chunk.range.begin * hidden,
                                    .output = chunk.gathered_dy.raw(),
                                    .num_elements_by_rank = dy_elements,
                                    .dtype = DType::f32,
                                    .tag = ep_tag(config_.tag_base, c, EpOp::backward_cotangent),
                                    .timeout = config_.timeout});
}

Tensor RingDispatcher::receive_cotangents(int c) {
  Chunk& chunk = *chunks_[c];
  if (!chunk.cotangent_started) start_cotangent_gather(c);
  chunk.cotangent_in_flight.wait();
  // Overlap: the next chunk's cotangent travels while this one's backward runs.
  if (config_.cotangent_all_gather == CotangentAllGather::ring && c + 1 < config_.num_chunks &&
      !chunks_[c + 1]->cotangent_started)
    start_cotangent_gather(c + 1);
  return std::move(chunk.gathered_dy);
}

void RingDispatcher::send_gradients(int c, Tensor slot_dx, std::vector<float> row_dweights) {
  Chunk& chunk = *chunks_[c];
  const int top_k = config_.top_k;
  const std::int64_t n = chunk.range.size(), hidden = config_.hidden;
  EPMOE_CHECK_EQ(slot_dx.numel(), chunk.num_slots * hidden);
  EPMOE_CHECK_EQ(row_dweights.size(), chunk.entry_of_row.size(), "combine-weight gradients of chunk ", c,
                 ": one per row computed here");
  chunk.slot_dx = std::move(slot_dx);
  chunk.dx_chunk = Tensor(DType::f32, {n, hidden});
  chunk.slot_dweights = Tensor::zeros(DType::f32, {chunk.num_slots, top_k});
  for (std::size_t r = 0; r < row_dweights.size(); ++r)
    chunk.slot_dweights.data<float>()[chunk.entry_slot_k[chunk.entry_of_row[r]]] = row_dweights[r];
  chunk.dweights_chunk = Tensor(DType::f32, {n, top_k});
  const std::vector<std::int64_t> dx_elements = times(chunk.rows_by_rank, hidden);
  const std::vector<std::int64_t> dweight_elements = times(chunk.rows_by_rank, top_k);
  stats_.bytes_sent["backward/reduce_scatter dx"] += reduce_scatter_bytes_sent(dx_elements, comm_.rank());
  stats_.bytes_sent["backward/reduce_scatter dweights"] += reduce_scatter_bytes_sent(dweight_elements, comm_.rank());
  chunk.dx_in_flight = comm::reduce_scatter(comm_, {.input = chunk.slot_dx.raw(),
                                                    .output = chunk.dx_chunk.raw(),
                                                    .num_elements_per_rank = dx_elements,
                                                    .tag = ep_tag(config_.tag_base, c, EpOp::backward_dx),
                                                    .timeout = config_.timeout});
  chunk.dweights_in_flight = comm::reduce_scatter(comm_, {.input = chunk.slot_dweights.raw(),
                                                          .output = chunk.dweights_chunk.raw(),
                                                          .num_elements_per_rank = dweight_elements,
                                                          .tag = ep_tag(config_.tag_base, c, EpOp::backward_dweights),
                                                          .timeout = config_.timeout});
}

DispatchGradients RingDispatcher::finish_backward() {
  const std::int64_t hidden = config_.hidden;
  const int top_k = config_.top_k;
  DispatchGradients grads{Tensor(DType::f32, {routing_.num_tokens, hidden}),
                          Tensor(DType::f32, {routing_.num_tokens, top_k})};
  for (auto& chunk : chunks_) {
    chunk->dx_in_flight.wait();
    chunk->dweights_in_flight.wait();
    const std::int64_t begin = chunk->range.begin;
    if (chunk->dx_chunk.size_bytes() > 0) {
      std::memcpy(grads.dx.data<float>() + begin * hidden, chunk->dx_chunk.raw(),
                  static_cast<std::size_t>(chunk->dx_chunk.size_bytes()));
      std::memcpy(grads.d_topk_weights.data<float>() + begin * top_k, chunk->dweights_chunk.raw(),
                  static_cast<std::size_t>(chunk->dweights_chunk.size_bytes()));
    }
  }
  return grads;
}

std::int64_t RingDispatcher::persistent_buffer_bytes() const {
  std::int64_t bytes = vector_capacity_bytes(tokens_by_rank_, pairs_seen_);
  for (const auto& chunk : chunks_) bytes += chunk->capacity_bytes();
  return bytes;
}

}  // namespace epmoe::ep
