#include "ep/ring_dispatcher.h"
#include "core/modelled_clock.h"

#include <cstring>

#include "comm/all_gather.h"
#include "comm/all_to_all_v.h"
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

// A ring reduce-scatter sends a partial sum of every block but this rank's,
// `element_bytes` per element (its wire_dtype).
std::int64_t reduce_scatter_bytes_sent(const std::vector<std::int64_t>& elements, int rank,
                                       std::int64_t element_bytes) {
  std::int64_t sent = 0;
  for (std::size_t b = 0; b < elements.size(); ++b)
    if (static_cast<int>(b) != rank) sent += elements[b] * element_bytes;
  return sent;
}

}  // namespace

struct RingDispatcher::Step final : StepState {
  // One chunk's layout: the gathered slots (every rank's chunk-c tokens), this
  // rank's routing words, and which gathered pairs this rank computes.
  struct Chunk {
    ChunkRange range;
    std::vector<std::int64_t> rows_by_rank;  // [R] this chunk's tokens on every rank
    std::vector<std::int64_t> slot_offset;   // [R] first slot of rank r's tokens
    std::int64_t num_slots = 0;              // sum of rows_by_rank
    float tensor_scale = 1.0f;
    // This rank's tokens' routing words: per token K destinations, then K
    // weight bits (they travel in front of the tokens, one all-gather).
    std::vector<std::int32_t> local_routing;
    std::vector<std::int64_t> entry_of_row;
    std::vector<std::int64_t> entry_slot_k;  // per entry: slot * K + k
    // The layer's tensors the exchanges read or fill, and the exchanges in
    // flight: declared after the tensors, so that when an abandoned step is
    // destroyed the handles wait for (or cancel) their collectives before
    // the tensors go.
    Tensor slot_outputs, gathered_dy, slot_dx;
    comm::CollectiveHandle gather_in_flight, combine_in_flight, cotangent_in_flight, dx_in_flight, dweights_in_flight;

    std::int64_t capacity_bytes() const {
      return vector_capacity_bytes(rows_by_rank, slot_offset, local_routing, entry_of_row, entry_slot_k);
    }
  };
  std::vector<Chunk> chunks;                 // grown to the most chunks a step had; capacity kept
  std::vector<std::int64_t> tokens_by_rank;  // [R] this step's token count of every rank
  // The count exchange in flight (begin_step), its send buffer (this rank's
  // count once per peer) and its known receive counts (one each); the chunk
  // layouts are planned once it is in (plan_chunks).
  std::vector<std::int64_t> own_count_per_peer, one_per_rank;
  comm::CollectiveHandle counts_in_flight;
  bool chunks_planned = false;

  std::int64_t capacity_bytes() const override {
    std::int64_t bytes = vector_capacity_bytes(tokens_by_rank, own_count_per_peer, one_per_rank) +
                         static_cast<std::int64_t>(chunks.capacity() * sizeof(Chunk));
    for (const Chunk& chunk : chunks) bytes += chunk.capacity_bytes();
    return bytes;
  }
};

struct RingDispatcher::Buffers final : PhaseBuffers {
  // One chunk's exchange buffers for one phase.
  struct Chunk {
    std::vector<std::byte> local_block, gathered_blocks;  // routing words + token rows, per rank's block
    std::vector<const std::byte*> row_address;            // per slot: its token row in gathered_blocks
    std::vector<float> y_rows;                            // forward: this rank's rows of y, reduce-scattered
    std::vector<float> slot_dweights, dx_rows, dweight_rows;
    // wire_dtype=bf16: this rank's dy rows and every rank's, as they travel.
    std::vector<bf16_t> local_dy, gathered_dy;

    std::int64_t capacity_bytes() const {
      return vector_capacity_bytes(local_block, gathered_blocks, row_address, y_rows, slot_dweights, dx_rows,
                                   dweight_rows, local_dy, gathered_dy);
    }
  };
  std::vector<Chunk> chunks;

  std::int64_t capacity_bytes() const override {
    std::int64_t bytes = 0;
    for (const Chunk& chunk : chunks) bytes += chunk.capacity_bytes();
    return bytes;
  }
};

RingDispatcher::RingDispatcher(transport::Communicator& comm, const EpConfig& config)
    : Dispatcher(&comm, config, comm.size(), comm.rank()) {
  EPMOE_CHECK(config.capacity_factor == 0.0, "the ring moves every token: capacity_factor is the all-to-all's");
}

RingDispatcher::~RingDispatcher() = default;

std::unique_ptr<StepState> RingDispatcher::make_step_state() const { return std::make_unique<Step>(); }

std::unique_ptr<PhaseBuffers> RingDispatcher::make_phase_buffers() const { return std::make_unique<Buffers>(); }

// The token counts go out first, one message to every peer posted at once
// (all_to_all_v with known counts), not as a ring all-gather: one int64
// cannot be split over the ring's two lanes, and a ring would take R-1
// store-and-forward steps, (R-1)·α (issue 30: 14 us at R=8 on 2 us hops,
// 2-9% of the ring step) where a direct message takes one hop on switched
// links and at most R/2 on a ring of links. The exchange moves while this
// rank builds every chunk's routing words and encodes chunk 0's tokens; only
// then does start_dispatch wait for it (plan_chunks).
void RingDispatcher::begin_step(StepState& base, const RoutingView& routing) {
  Step& step = static_cast<Step&>(base);
  Buffers& buffers = static_cast<Buffers&>(*step.buffers);
  const EpConfig& cfg = config();
  const int ranks = num_ranks(), top_k = step.top_k;
  step.tokens_by_rank.assign(static_cast<std::size_t>(ranks), routing.num_tokens);
  step.chunks_planned = false;
  if (ranks > 1) {
    step.own_count_per_peer.assign(static_cast<std::size_t>(ranks), routing.num_tokens);
    step.one_per_rank.assign(static_cast<std::size_t>(ranks), 1);
    step.counts_in_flight = comm::all_to_all_v(comm(), {.input = step.own_count_per_peer.data(),
                                                        .send_counts = step.one_per_rank,
                                                        .dtype = DType::i64,
                                                        .known_recv_counts = &step.one_per_rank,
                                                        .recv_buffer = step.tokens_by_rank.data(),
                                                        .tag = ep_tag(step.tag_base, 1, EpOp::ring_token_counts),
                                                        .timeout = cfg.timeout});
  }
  step.stats.bytes_sent["forward/ring token counts"] += 8 * (ranks - 1);  // one i64 per other rank
  if (static_cast<int>(step.chunks.size()) < step.num_chunks) step.chunks.resize(step.num_chunks);
  if (static_cast<int>(buffers.chunks.size()) < step.num_chunks) buffers.chunks.resize(step.num_chunks);
  for (int c = 0; c < step.num_chunks; ++c) {
    Step::Chunk& chunk = step.chunks[c];
    chunk.range = chunk_range(routing.num_tokens, step.num_chunks, c);
    // The routing travels with the tokens (one ring, not two), so the
    // words are made now, from the routing this call alone sees.
    const std::int64_t n = chunk.range.size();
    chunk.local_routing.resize(static_cast<std::size_t>(n * 2 * top_k));
    for (std::int64_t t = 0; t < n; ++t)
      for (int k = 0; k < top_k; ++k) {
        const std::int64_t pair = (chunk.range.begin + t) * top_k + k;
        chunk.local_routing[(t * 2) * top_k + k] = routing.destinations[pair];
        std::memcpy(&chunk.local_routing[(t * 2 + 1) * top_k + k], &routing.topk_weights[pair], 4);
      }
  }
}

// Waits for the token counts (the first time) and lays out every chunk's
// gathered slots: rank 0's chunk-c tokens, then rank 1's, ...
void RingDispatcher::plan_chunks(Step& step) const {
  if (step.chunks_planned) return;
  step.counts_in_flight.wait();
  for (int c = 0; c < step.num_chunks; ++c) {
    Step::Chunk& chunk = step.chunks[c];
    chunk.rows_by_rank.clear();
    chunk.slot_offset.clear();
    chunk.num_slots = 0;
    for (int r = 0; r < num_ranks(); ++r) {
      chunk.slot_offset.push_back(chunk.num_slots);
      chunk.rows_by_rank.push_back(chunk_range(step.tokens_by_rank[r], step.num_chunks, c).size());
      chunk.num_slots += chunk.rows_by_rank.back();
    }
  }
  step.chunks_planned = true;
}

// Starts chunk c's all-gather of tokens and their routing, one block per
// rank: in the forward, or again in the backward when x_sorted is
// recomputed (then the fp8 scale is reused).
void RingDispatcher::start_dispatch(StepState& base, int c, bool remat) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  Buffers::Chunk& buffers = static_cast<Buffers&>(*step.buffers).chunks[c];
  const int top_k = step.top_k;
  const std::int64_t hidden = config().hidden, n = chunk.range.size();
  if (config().token_format == TokenFormat::fp8_tensor && !remat) chunk.tensor_scale = step.tensor_scales.scale(c);
  const std::int64_t row_bytes = codec().row_bytes(), routing_bytes = 8 * top_k;
  buffers.local_block.resize(static_cast<std::size_t>(n * (routing_bytes + row_bytes)));
  if (n > 0) std::memcpy(buffers.local_block.data(), chunk.local_routing.data(), n * routing_bytes);
  {
    // Charged before the all-gather is launched (the scope ends here): its
    // block leaves once packed, not while it is being packed.
    const ComputeScope encode("token encode", {.bytes = static_cast<double>(n) * (4.0 * hidden + row_bytes)});
    codec().encode(step.x.data<float>() + chunk.range.begin * hidden, nullptr, n, chunk.tensor_scale,
                   buffers.local_block.data() + n * routing_bytes);
  }
  plan_chunks(step);  // the first chunk's own work is done: now the counts are needed
  buffers.gathered_blocks.resize(static_cast<std::size_t>(chunk.num_slots * (routing_bytes + row_bytes)));
  const std::string prefix = remat ? "backward/remat " : "forward/";
  step.stats.bytes_sent[prefix + "ring_all_gather tokens"] +=
      all_gather_bytes_sent(times(chunk.rows_by_rank, row_bytes), rank(), 1);
  step.stats.bytes_sent[prefix + "ring_all_gather routing"] +=
      all_gather_bytes_sent(times(chunk.rows_by_rank, 2 * top_k), rank(), 4);
  chunk.gather_in_flight =
      comm::ring_all_gather(comm(), {.input = buffers.local_block.data(),
                                     .output = buffers.gathered_blocks.data(),
                                     .num_elements_by_rank = times(chunk.rows_by_rank, routing_bytes + row_bytes),
                                     .dtype = DType::fp8_e4m3,
                                     .tag = ep_tag(step.tag_base, c, remat ? EpOp::remat_tokens : EpOp::forward_tokens),
                                     .timeout = config().timeout});
}

// Waits for chunk c's gather and keeps the pairs whose destination is on
// this rank.
ExpertRows RingDispatcher::collect_rows(StepState& base, int c, bool /*remat*/) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  Buffers::Chunk& buffers = static_cast<Buffers&>(*step.buffers).chunks[c];
  // Test hook (core/fault_injection.h): fail with the token all-gather in flight.
  fault_point("dispatch", rank());
  chunk.gather_in_flight.wait();

  // Rank r's block starts at its first slot times the bytes per token; its
  // routing words are read with memcpy (a block starts at any byte offset).
  const int top_k = step.top_k;
  const std::int64_t row_bytes = codec().row_bytes(), routing_bytes = 8 * top_k;
  const std::byte* blocks = buffers.gathered_blocks.data();
  buffers.row_address.clear();
  for (int source = 0; source < num_ranks(); ++source) {
    const std::int64_t first_slot = chunk.slot_offset[source], rows = chunk.rows_by_rank[source];
    const std::byte* tokens = blocks + first_slot * (routing_bytes + row_bytes) + rows * routing_bytes;
    for (std::int64_t i = 0; i < rows; ++i) buffers.row_address.push_back(tokens + i * row_bytes);
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
  const int stride = experts_per_rank(), me = rank();
  // Slot g of source rank `source`'s block: its tokens arrive in token order.
  for (int source = 0; source < num_ranks(); ++source) {
    const std::int64_t end = chunk.slot_offset[source] + chunk.rows_by_rank[source];
    for (std::int64_t g = chunk.slot_offset[source]; g < end; ++g) {
      for (int k = 0; k < top_k; ++k) {
        const std::int32_t destination = routing_word(source, g, k);
        if (destination / stride != me) continue;
        const std::int32_t weight_bits = routing_word(source, g, top_k + k);
        float weight;
        std::memcpy(&weight, &weight_bits, sizeof weight);
        entries.add(destination % stride, weight, g, g);
        chunk.entry_slot_k.push_back(g * top_k + k);
      }
    }
  }
  return build_expert_rows(codec(), chunk.tensor_scale, buffers.row_address, entries, stride, chunk.num_slots,
                           &chunk.entry_of_row);
}

void RingDispatcher::start_combine(StepState& base, int c, Tensor slot_outputs) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  Buffers::Chunk& buffers = static_cast<Buffers&>(*step.buffers).chunks[c];
  const std::int64_t n = chunk.range.size(), hidden = config().hidden;
  EPMOE_CHECK_EQ(slot_outputs.numel(), chunk.num_slots * hidden, "expert outputs of chunk ", c,
                 ": one H-row per slot of the gathered tokens");
  chunk.slot_outputs = std::move(slot_outputs);
  buffers.y_rows.resize(static_cast<std::size_t>(n * hidden));
  const std::vector<std::int64_t> output_elements = times(chunk.rows_by_rank, hidden);
  step.stats.bytes_sent["forward/reduce_scatter combine"] +=
      reduce_scatter_bytes_sent(output_elements, rank(), wire_element_bytes());
  chunk.combine_in_flight = comm::reduce_scatter(comm(), {.input = chunk.slot_outputs.raw(),
                                                          .output = buffers.y_rows.data(),
                                                          .num_elements_per_rank = output_elements,
                                                          .wire_dtype = wire_dtype(),
                                                          .tag = ep_tag(step.tag_base, c, EpOp::forward_combine),
                                                          .timeout = config().timeout});
}

void RingDispatcher::finish_combine(StepState& base, int c, float* y) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  const Buffers::Chunk& buffers = static_cast<Buffers&>(*step.buffers).chunks[c];
  chunk.combine_in_flight.wait();
  const ComputeScope unpack("unpack rows", {.bytes = 8.0 * static_cast<double>(buffers.y_rows.size())});
  if (!buffers.y_rows.empty())
    std::memcpy(y + chunk.range.begin * config().hidden, buffers.y_rows.data(), buffers.y_rows.size() * sizeof(float));
  chunk.slot_outputs = Tensor();
}

void RingDispatcher::start_cotangents(StepState& base, int c) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  Buffers::Chunk& buffers = static_cast<Buffers&>(*step.buffers).chunks[c];
  const std::int64_t hidden = config().hidden;
  // Handed to the experts as it is (collect_cotangents): the layer's.
  chunk.gathered_dy = Tensor(DType::f32, {chunk.num_slots, hidden});
  const std::vector<std::int64_t> dy_elements = times(chunk.rows_by_rank, hidden);
  step.stats.bytes_sent["backward/ring_all_gather cotangent"] +=
      all_gather_bytes_sent(dy_elements, rank(), wire_element_bytes());
  const float* own_dy = step.dy.data<float>() + chunk.range.begin * hidden;
  // bf16 wire: rounded once by its owner, forwarded as it is (every rank's
  // experts see the same values, this rank's own rows included).
  if (bf16_wire()) {
    to_wire(own_dy, chunk.range.size() * hidden, buffers.local_dy);
    buffers.gathered_dy.resize(static_cast<std::size_t>(chunk.num_slots * hidden));
  }
  chunk.cotangent_in_flight = comm::ring_all_gather(
      comm(), {.input = bf16_wire() ? static_cast<const void*>(buffers.local_dy.data()) : own_dy,
               .output = bf16_wire() ? static_cast<void*>(buffers.gathered_dy.data()) : chunk.gathered_dy.raw(),
               .num_elements_by_rank = dy_elements,
               .dtype = wire_dtype(),
               .tag = ep_tag(step.tag_base, c, EpOp::backward_cotangent),
               .timeout = config().timeout});
}

Tensor RingDispatcher::collect_cotangents(StepState& base, int c) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  chunk.cotangent_in_flight.wait();
  if (bf16_wire())
    from_wire(static_cast<Buffers&>(*step.buffers).chunks[c].gathered_dy, chunk.gathered_dy.data<float>());
  return std::move(chunk.gathered_dy);
}

void RingDispatcher::start_gradients(StepState& base, int c, Tensor slot_dx, std::vector<float> row_dweights) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  Buffers::Chunk& buffers = static_cast<Buffers&>(*step.buffers).chunks[c];
  const int top_k = step.top_k;
  const std::int64_t n = chunk.range.size(), hidden = config().hidden;
  EPMOE_CHECK_EQ(slot_dx.numel(), chunk.num_slots * hidden);
  EPMOE_CHECK_EQ(row_dweights.size(), chunk.entry_of_row.size(), "combine-weight gradients of chunk ", c,
                 ": one per row computed here");
  chunk.slot_dx = std::move(slot_dx);
  buffers.slot_dweights.assign(static_cast<std::size_t>(chunk.num_slots * top_k), 0.0f);
  for (std::size_t r = 0; r < row_dweights.size(); ++r)
    buffers.slot_dweights[chunk.entry_slot_k[chunk.entry_of_row[r]]] = row_dweights[r];
  buffers.dx_rows.resize(static_cast<std::size_t>(n * hidden));
  buffers.dweight_rows.resize(static_cast<std::size_t>(n * top_k));
  const std::vector<std::int64_t> dx_elements = times(chunk.rows_by_rank, hidden);
  const std::vector<std::int64_t> dweight_elements = times(chunk.rows_by_rank, top_k);
  step.stats.bytes_sent["backward/reduce_scatter dx"] +=
      reduce_scatter_bytes_sent(dx_elements, rank(), wire_element_bytes());
  step.stats.bytes_sent["backward/reduce_scatter dweights"] += reduce_scatter_bytes_sent(dweight_elements, rank(), 4);
  chunk.dx_in_flight = comm::reduce_scatter(comm(), {.input = chunk.slot_dx.raw(),
                                                     .output = buffers.dx_rows.data(),
                                                     .num_elements_per_rank = dx_elements,
                                                     .wire_dtype = wire_dtype(),
                                                     .tag = ep_tag(step.tag_base, c, EpOp::backward_dx),
                                                     .timeout = config().timeout});
  chunk.dweights_in_flight = comm::reduce_scatter(comm(), {.input = buffers.slot_dweights.data(),
                                                           .output = buffers.dweight_rows.data(),
                                                           .num_elements_per_rank = dweight_elements,
                                                           .tag = ep_tag(step.tag_base, c, EpOp::backward_dweights),
                                                           .timeout = config().timeout});
}

void RingDispatcher::finish_gradients(StepState& base, int c, float* dx, float* d_topk_weights) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  const Buffers::Chunk& buffers = static_cast<Buffers&>(*step.buffers).chunks[c];
  chunk.dx_in_flight.wait();
  chunk.dweights_in_flight.wait();
  const std::int64_t begin = chunk.range.begin;
  const ComputeScope unpack("unpack rows",
                            {.bytes = 8.0 * static_cast<double>(buffers.dx_rows.size() + buffers.dweight_rows.size())});
  if (!buffers.dx_rows.empty()) {
    std::memcpy(dx + begin * config().hidden, buffers.dx_rows.data(), buffers.dx_rows.size() * sizeof(float));
    std::memcpy(d_topk_weights + begin * step.top_k, buffers.dweight_rows.data(),
                buffers.dweight_rows.size() * sizeof(float));
  }
  chunk.slot_dx = Tensor();
}

}  // namespace epmoe::ep
