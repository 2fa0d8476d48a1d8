#include "ep/alltoall_dispatcher.h"
#include "core/modelled_clock.h"

#include <cmath>
#include <cstring>

#include "comm/all_to_all_v.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "ep/collective_tags.h"

namespace epmoe::ep {

struct AllToAllDispatcher::Step final : StepState {
  // One chunk's layout: which rows went where and came from where. "Send" is
  // this rank's tokens going out (and their results coming back); "recv" is
  // other ranks' tokens arriving here. The forward's counts size everything
  // after it: the combine, the remat re-send and the whole backward exchange
  // with known counts (no count round).
  struct Chunk {
    ChunkRange range;
    // Send side, grouped by destination rank.
    std::vector<std::int64_t> send_row_token;       // local token of each row
    std::vector<std::int64_t> send_rows_per_rank;   // [R]
    std::vector<std::int64_t> send_entry_pair;      // pair (t * K + k) of each entry
    std::vector<std::int64_t> send_words_per_rank;  // [R] routing words
    std::vector<std::int32_t> send_metadata;        // routing words, by destination
    std::vector<std::int64_t> send_message_counts;  // [R] bytes
    float tensor_scale = 1.0f;
    // Receive side, grouped by source rank.
    std::vector<std::int64_t> recv_message_counts;  // [R] bytes, learnt by the forward's exchange
    std::vector<std::int64_t> recv_rows_per_rank, recv_entries_per_rank;
    std::vector<std::int64_t> entry_of_row;  // expert row -> received entry
    // Element counts per rank, known from the forward's exchange: rows out
    // (this rank's rows at each destination) and rows in (each source's rows
    // here), times H; entries out, per destination.
    std::vector<std::int64_t> rows_out_elements, rows_in_elements, send_entries_per_rank;
    // The layer's tensors the exchanges read or fill, and the exchanges in
    // flight: declared after the tensors, so that when an abandoned step is
    // destroyed the handles wait for (or cancel) their collectives before
    // the tensors go.
    Tensor slot_outputs, recv_dy, slot_dx;
    comm::CollectiveHandle message_in_flight, combine_in_flight, cotangent_in_flight, dx_in_flight, dweights_in_flight;

    std::int64_t capacity_bytes() const {
      return vector_capacity_bytes(send_row_token, send_rows_per_rank, send_entry_pair, send_words_per_rank,
                                   send_metadata, send_message_counts, recv_message_counts, recv_rows_per_rank,
                                   recv_entries_per_rank, entry_of_row, rows_out_elements, rows_in_elements,
                                   send_entries_per_rank);
    }
  };
  std::vector<Chunk> chunks;  // grown to the most chunks a step had; capacity kept

  std::int64_t capacity_bytes() const override {
    std::int64_t bytes = static_cast<std::int64_t>(chunks.capacity() * sizeof(Chunk));
    for (const Chunk& chunk : chunks) bytes += chunk.capacity_bytes();
    return bytes;
  }
};

struct AllToAllDispatcher::Buffers final : PhaseBuffers {
  // One chunk's exchange buffers for one phase.
  struct Chunk {
    std::vector<std::byte> send_message;  // per destination: routing words, then token rows
    std::vector<std::byte> recv_message;
    std::vector<float> combined;  // forward: this rank's rows' outputs, back from their ranks
    std::vector<float> send_dy;   // backward: dy rows, the forward way
    std::vector<float> entry_dweights;
    std::vector<float> dx_back, dweights_back;
    // wire_dtype=bf16: the combine's, dy's and dx's rows as they travel.
    std::vector<bf16_t> combine_out, combine_in, dy_out, dy_in, dx_out, dx_in;

    std::int64_t capacity_bytes() const {
      return vector_capacity_bytes(send_message, recv_message, combined, send_dy, entry_dweights, dx_back,
                                   dweights_back, combine_out, combine_in, dy_out, dy_in, dx_out, dx_in);
    }
  };
  std::vector<Chunk> chunks;
  // plan_chunk's per-destination lists and collect_rows' per-source counts.
  std::vector<std::vector<std::int64_t>> rows_to, entries_to;
  std::vector<std::vector<std::int32_t>> words_to;
  std::vector<std::int64_t> pairs_per_expert;
  std::vector<std::pair<int, std::int64_t>> kept;
  std::vector<std::int64_t> rows_from, entries_from, tokens_at;
  std::vector<const std::byte*> row_address;

  std::int64_t capacity_bytes() const override {
    std::int64_t bytes = vector_capacity_bytes(pairs_per_expert, kept, rows_from, entries_from, tokens_at, row_address);
    for (std::size_t d = 0; d < rows_to.size(); ++d)
      bytes += vector_capacity_bytes(rows_to[d], entries_to[d], words_to[d]);
    for (const Chunk& chunk : chunks) bytes += chunk.capacity_bytes();
    return bytes;
  }
};

AllToAllDispatcher::AllToAllDispatcher(transport::Communicator& comm, const EpConfig& config)
    : Dispatcher(&comm, config, comm.size(), comm.rank()) {}

AllToAllDispatcher::~AllToAllDispatcher() = default;

std::unique_ptr<StepState> AllToAllDispatcher::make_step_state() const { return std::make_unique<Step>(); }

std::unique_ptr<PhaseBuffers> AllToAllDispatcher::make_phase_buffers() const { return std::make_unique<Buffers>(); }

void AllToAllDispatcher::begin_step(StepState& base, const RoutingView& routing) {
  Step& step = static_cast<Step&>(base);
  Buffers& buffers = static_cast<Buffers&>(*step.buffers);
  if (static_cast<int>(step.chunks.size()) < step.num_chunks) step.chunks.resize(step.num_chunks);
  if (static_cast<int>(buffers.chunks.size()) < step.num_chunks) buffers.chunks.resize(step.num_chunks);
  // Every chunk's layout now, from the routing (not kept after this call).
  for (int c = 0; c < step.num_chunks; ++c) plan_chunk(step, buffers, routing, c);
}

// Which rows go where, with which routing words.
void AllToAllDispatcher::plan_chunk(Step& step, Buffers& scratch, const RoutingView& routing, int c) {
  Step::Chunk& chunk = step.chunks[c];
  chunk.range = chunk_range(routing.num_tokens, step.num_chunks, c);
  chunk.send_row_token.clear();
  chunk.send_entry_pair.clear();
  chunk.send_metadata.clear();
  const int ranks = num_ranks(), top_k = step.top_k, stride = experts_per_rank();
  const int num_destinations = ranks * stride;
  const std::int64_t hidden = config().hidden;

  // Which pairs go where, in (token, k) order; capacity drops later tokens.
  scratch.rows_to.resize(ranks);
  scratch.entries_to.resize(ranks);
  scratch.words_to.resize(ranks);
  for (int d = 0; d < ranks; ++d) {
    scratch.rows_to[d].clear();
    scratch.entries_to[d].clear();
    scratch.words_to[d].clear();
  }
  auto& rows_to = scratch.rows_to;
  auto& entries_to = scratch.entries_to;
  auto& words_to = scratch.words_to;
  std::vector<std::int64_t>& pairs_per_expert = scratch.pairs_per_expert;
  pairs_per_expert.assign(static_cast<std::size_t>(num_destinations), 0);
  const std::int64_t capacity =
      config().capacity_factor > 0
          ? static_cast<std::int64_t>(
                std::ceil(config().capacity_factor * double(chunk.range.size()) * top_k / config().num_experts))
          : -1;
  std::vector<std::pair<int, std::int64_t>>& kept = scratch.kept;  // (dest, pair)
  for (std::int64_t t = chunk.range.begin; t < chunk.range.end; ++t) {
    // With dedup, one row per destination, entries in k order; without, one
    // row per pair.
    kept.clear();
    for (int k = 0; k < top_k; ++k) {
      const std::int64_t pair = t * top_k + k;
      const int destination = routing.destinations[pair];
      EPMOE_CHECK(destination >= 0 && destination < num_destinations, "destination of local token ", t, ", k ", k, ": ",
                  destination, " is outside [0, ", num_destinations, ")");
      if (capacity >= 0 && pairs_per_expert[destination] >= capacity) {
        step.stats.dropped_pairs += 1;
        continue;
      }
      pairs_per_expert[destination] += 1;
      kept.emplace_back(destination / stride, pair);
    }
    if (config().dedup)
      std::stable_sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (std::size_t i = 0; i < kept.size();) {
      const int dest = kept[i].first;
      std::size_t j = i + 1;
      if (config().dedup)
        while (j < kept.size() && kept[j].first == dest) ++j;
      rows_to[dest].push_back(t);
      words_to[dest].push_back(static_cast<std::int32_t>(j - i));
      for (std::size_t e = i; e < j; ++e) {
        const std::int64_t pair = kept[e].second;
        entries_to[dest].push_back(pair);
        std::int32_t weight_bits;
        std::memcpy(&weight_bits, &routing.topk_weights[pair], sizeof weight_bits);
        words_to[dest].push_back(routing.destinations[pair] - dest * stride);
        words_to[dest].push_back(weight_bits);
      }
      i = j;
    }
  }
  chunk.send_rows_per_rank.assign(ranks, 0);
  chunk.send_words_per_rank.assign(ranks, 0);
  chunk.send_entries_per_rank.assign(ranks, 0);
  chunk.rows_out_elements.assign(ranks, 0);
  for (int d = 0; d < ranks; ++d) {
    chunk.send_rows_per_rank[d] = static_cast<std::int64_t>(rows_to[d].size());
    chunk.send_words_per_rank[d] = static_cast<std::int64_t>(words_to[d].size());
    chunk.send_entries_per_rank[d] = static_cast<std::int64_t>(entries_to[d].size());
    chunk.rows_out_elements[d] = chunk.send_rows_per_rank[d] * hidden;
    chunk.send_row_token.insert(chunk.send_row_token.end(), rows_to[d].begin(), rows_to[d].end());
    chunk.send_entry_pair.insert(chunk.send_entry_pair.end(), entries_to[d].begin(), entries_to[d].end());
    chunk.send_metadata.insert(chunk.send_metadata.end(), words_to[d].begin(), words_to[d].end());
  }
}

void AllToAllDispatcher::start_dispatch(StepState& base, int c, bool remat) {
  Step& step = static_cast<Step&>(base);
  // The forward reads the chunk's agreed scale; a remat re-send reuses it.
  if (!remat && config().token_format == TokenFormat::fp8_tensor)
    step.chunks[c].tensor_scale = step.tensor_scales.scale(c);
  send_tokens(step, c, remat);
}

// One message per destination: its routing words, then its token rows
// (TokenCodec), in one all_to_all_v: one count round per chunk, not one for
// the tokens and one for the words. The receiver finds the boundary without
// a header (collect_rows).
void AllToAllDispatcher::send_tokens(Step& step, int c, bool remat) {
  Step::Chunk& chunk = step.chunks[c];
  Buffers::Chunk& buffers = static_cast<Buffers&>(*step.buffers).chunks[c];
  const int ranks = num_ranks();
  const std::int64_t row_bytes = codec().row_bytes();
  std::vector<std::int64_t>& message_counts = chunk.send_message_counts;
  message_counts.resize(ranks);
  std::int64_t message_bytes = 0;
  for (int d = 0; d < ranks; ++d) {
    message_counts[d] = 4 * chunk.send_words_per_rank[d] + chunk.send_rows_per_rank[d] * row_bytes;
    message_bytes += message_counts[d];
  }
  buffers.send_message.resize(static_cast<std::size_t>(message_bytes));
  std::byte* out = buffers.send_message.data();
  const std::int32_t* words = chunk.send_metadata.data();
  const std::int64_t* row_token = chunk.send_row_token.data();
  {
    // Packing the message: each row read as f32, written in the wire format.
    // Charged before the exchange is launched (the scope ends here): the
    // message cannot leave before it is packed.
    const ComputeScope encode("token encode", {.bytes = static_cast<double>(chunk.send_row_token.size()) *
                                                        (4.0 * config().hidden + static_cast<double>(row_bytes))});
    for (int d = 0; d < ranks; ++d) {
      const std::int64_t word_bytes = 4 * chunk.send_words_per_rank[d], rows = chunk.send_rows_per_rank[d];
      if (word_bytes > 0) std::memcpy(out, words, static_cast<std::size_t>(word_bytes));
      codec().encode(step.x.data<float>(), row_token, rows, chunk.tensor_scale, out + word_bytes);
      out += message_counts[d];
      words += chunk.send_words_per_rank[d];
      row_token += rows;
    }
  }

  count_bytes(step, remat ? "backward/remat all_to_all_v tokens" : "forward/all_to_all_v tokens",
              chunk.send_rows_per_rank, row_bytes);
  count_bytes(step, remat ? "backward/remat all_to_all_v routing" : "forward/all_to_all_v routing",
              chunk.send_words_per_rank, 4);
  // The forward's exchange learns the receive counts (one i64 to each peer
  // before the payload); a remat re-send knows them (the same rows as the
  // forward's, bit for bit).
  if (!remat) step.stats.bytes_sent["forward/all_to_all_v counts"] += 8 * (ranks - 1);
  chunk.message_in_flight =
      comm::all_to_all_v(comm(), {.input = buffers.send_message.data(),
                                  .send_counts = message_counts,
                                  .dtype = DType::fp8_e4m3,
                                  .output = &buffers.recv_message,
                                  .recv_counts = remat ? nullptr : &chunk.recv_message_counts,
                                  .known_recv_counts = remat ? &chunk.recv_message_counts : nullptr,
                                  .tag = ep_tag(step.tag_base, c, remat ? EpOp::remat_tokens : EpOp::forward_tokens),
                                  .timeout = config().timeout});
}

// Waits for chunk c's messages and sorts them into rows. The forward learns
// the chunk's receive layout here (rows and entries from each source); a
// remat re-collect only checks it: the backward's exchanges read it as their
// known counts.
ExpertRows AllToAllDispatcher::collect_rows(StepState& base, int c, bool remat) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  Buffers& scratch = static_cast<Buffers&>(*step.buffers);
  Buffers::Chunk& buffers = scratch.chunks[c];
  // Test hook (core/fault_injection.h): fail with the token exchange in flight.
  fault_point("dispatch", rank());
  chunk.message_in_flight.wait();

  // Each source's message is its routing words, per row [n, (local expert,
  // weight bits) x n], then its rows' tokens. The words end after the j-th
  // row exactly when the bytes left are j token rows: before the last row,
  // the bytes left are more (the remaining words plus all J > j rows). Words
  // are read with memcpy: a message starts at any byte offset.
  const int ranks = num_ranks(), stride = experts_per_rank();
  const std::int64_t row_bytes = codec().row_bytes();
  const std::byte* message = buffers.recv_message.data();
  RowEntries entries;
  std::vector<std::int64_t>& rows_from = scratch.rows_from;
  std::vector<std::int64_t>& entries_from = scratch.entries_from;
  std::vector<std::int64_t>& tokens_at = scratch.tokens_at;
  rows_from.assign(ranks, 0);
  entries_from.assign(ranks, 0);
  tokens_at.assign(ranks, 0);
  auto read_word = [&](std::int64_t at) {
    std::int32_t word;
    std::memcpy(&word, message + at, sizeof word);
    return word;
  };
  std::int64_t begin = 0, row = 0;
  for (int s = 0; s < ranks; ++s) {
    const std::int64_t end = begin + chunk.recv_message_counts[s];
    std::int64_t at = begin;
    while (end - at != rows_from[s] * row_bytes) {
      EPMOE_CHECK(end - at >= 4 + (rows_from[s] + 1) * row_bytes, "chunk ", c, ": the message from rank ", s,
                  " ends inside its routing words (", rows_from[s], " rows read)");
      const std::int32_t n = read_word(at);
      at += 4;
      EPMOE_CHECK(n >= 1 && at + 8 * std::int64_t(n) + (rows_from[s] + 1) * row_bytes <= end, "chunk ", c, ": row ",
                  rows_from[s], " from rank ", s, " announces ", n, " entries that its message does not hold");
      for (std::int32_t i = 0; i < n; ++i, at += 8) {
        const std::int32_t expert = read_word(at);
        EPMOE_CHECK(expert >= 0 && expert < stride, "chunk ", c, ": rank ", s,
                    " routed a row to a local expert (or replica slot) this rank does not have");
        float weight;
        std::memcpy(&weight, message + at + 4, sizeof weight);
        entries.add(expert, weight, row, row);
      }
      entries_from[s] += n;
      rows_from[s] += 1;
      ++row;
    }
    tokens_at[s] = at;
    begin = end;
  }
  EPMOE_CHECK_EQ(begin, static_cast<std::int64_t>(buffers.recv_message.size()));
  const std::int64_t num_rows = row;
  std::vector<const std::byte*>& row_address = scratch.row_address;
  row_address.clear();
  for (int s = 0; s < ranks; ++s)
    for (std::int64_t i = 0; i < rows_from[s]; ++i) row_address.push_back(message + tokens_at[s] + i * row_bytes);

  if (remat) {
    EPMOE_CHECK(rows_from == chunk.recv_rows_per_rank && entries_from == chunk.recv_entries_per_rank, "chunk ", c,
                ": the recomputing re-send must bring the forward's rows and entries per rank");
  } else {
    chunk.recv_rows_per_rank = rows_from;
    chunk.recv_entries_per_rank = entries_from;
    chunk.rows_in_elements.resize(ranks);
    for (int s = 0; s < ranks; ++s) chunk.rows_in_elements[s] = rows_from[s] * config().hidden;
  }
  return build_expert_rows(codec(), chunk.tensor_scale, row_address, entries, stride, num_rows, &chunk.entry_of_row);
}

void AllToAllDispatcher::start_combine(StepState& base, int c, Tensor slot_outputs) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  Buffers::Chunk& buffers = static_cast<Buffers&>(*step.buffers).chunks[c];
  std::int64_t total = 0;
  for (const std::int64_t count : chunk.rows_in_elements) total += count;
  EPMOE_CHECK_EQ(slot_outputs.numel(), total, "expert outputs of chunk ", c, ": one H-row per row received");
  chunk.slot_outputs = std::move(slot_outputs);
  count_bytes(step, "forward/all_to_all_v combine", chunk.rows_in_elements, wire_element_bytes());
  buffers.combined.resize(chunk.send_row_token.size() * config().hidden);
  // bf16 wire: every row rounded once (this rank's own too: one code path).
  if (bf16_wire()) {
    to_wire(chunk.slot_outputs.data<float>(), total, buffers.combine_out);
    buffers.combine_in.resize(buffers.combined.size());
  }
  chunk.combine_in_flight = comm::all_to_all_v(
      comm(), {.input = bf16_wire() ? static_cast<const void*>(buffers.combine_out.data()) : chunk.slot_outputs.raw(),
               .send_counts = chunk.rows_in_elements,
               .dtype = wire_dtype(),
               .known_recv_counts = &chunk.rows_out_elements,
               .recv_buffer = bf16_wire() ? static_cast<void*>(buffers.combine_in.data()) : buffers.combined.data(),
               .tag = ep_tag(step.tag_base, c, EpOp::forward_combine),
               .timeout = config().timeout});
}

namespace {

// out[token[i]] += rows[i] for i in order, on rows zeroed first: the home
// side of a combine (and of dx), written over the chunk's token range.
void sum_rows_into_tokens(const float* rows, const std::vector<std::int64_t>& token, ChunkRange range,
                          std::int64_t hidden, float* out) {
  // Reads every row, reads and writes its token's row; zeroes the range.
  const ComputeScope charge("combine home sum",
                            {.flops = static_cast<double>(token.size() * hidden),
                             .bytes = 12.0 * static_cast<double>(token.size() * hidden) + 4.0 * range.size() * hidden});
  if (range.size() > 0) std::memset(out + range.begin * hidden, 0, static_cast<std::size_t>(range.size() * hidden) * 4);
  for (std::size_t i = 0; i < token.size(); ++i) {
    const float* src = rows + static_cast<std::int64_t>(i) * hidden;
    float* dst = out + token[i] * hidden;
    for (std::int64_t j = 0; j < hidden; ++j) dst[j] += src[j];
  }
}

}  // namespace

void AllToAllDispatcher::finish_combine(StepState& base, int c, float* y) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  chunk.combine_in_flight.wait();
  Buffers::Chunk& buffers = static_cast<Buffers&>(*step.buffers).chunks[c];
  if (bf16_wire()) from_wire(buffers.combine_in, buffers.combined.data());
  sum_rows_into_tokens(buffers.combined.data(), chunk.send_row_token, chunk.range, config().hidden, y);
  chunk.slot_outputs = Tensor();
}

void AllToAllDispatcher::start_cotangents(StepState& base, int c) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  Buffers::Chunk& buffers = static_cast<Buffers&>(*step.buffers).chunks[c];
  const std::int64_t hidden = config().hidden;
  buffers.send_dy.resize(chunk.send_row_token.size() * hidden);
  {
    // Charged before the exchange is launched, as the tokens' packing is.
    const ComputeScope pack("pack cotangents", {.bytes = 8.0 * static_cast<double>(buffers.send_dy.size())});
    for (std::size_t i = 0; i < chunk.send_row_token.size(); ++i)
      std::memcpy(&buffers.send_dy[i * hidden], step.dy.data<float>() + chunk.send_row_token[i] * hidden,
                  hidden * sizeof(float));
  }
  count_bytes(step, "backward/all_to_all_v cotangent", chunk.rows_out_elements, wire_element_bytes());
  std::int64_t rows_in = 0;
  for (const std::int64_t count : chunk.recv_rows_per_rank) rows_in += count;
  // Handed to the experts as they are (collect_cotangents): the layer's.
  chunk.recv_dy = Tensor(DType::f32, {rows_in, hidden});
  if (bf16_wire()) {
    to_wire(buffers.send_dy.data(), static_cast<std::int64_t>(buffers.send_dy.size()), buffers.dy_out);
    buffers.dy_in.resize(static_cast<std::size_t>(rows_in * hidden));
  }
  chunk.cotangent_in_flight = comm::all_to_all_v(
      comm(), {.input = bf16_wire() ? static_cast<const void*>(buffers.dy_out.data()) : buffers.send_dy.data(),
               .send_counts = chunk.rows_out_elements,
               .dtype = wire_dtype(),
               .known_recv_counts = &chunk.rows_in_elements,
               .recv_buffer = bf16_wire() ? static_cast<void*>(buffers.dy_in.data()) : chunk.recv_dy.raw(),
               .tag = ep_tag(step.tag_base, c, EpOp::backward_cotangent),
               .timeout = config().timeout});
}

Tensor AllToAllDispatcher::collect_cotangents(StepState& base, int c) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  chunk.cotangent_in_flight.wait();
  if (bf16_wire()) from_wire(static_cast<Buffers&>(*step.buffers).chunks[c].dy_in, chunk.recv_dy.data<float>());
  return std::move(chunk.recv_dy);
}

void AllToAllDispatcher::start_gradients(StepState& base, int c, Tensor slot_dx, std::vector<float> row_dweights) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  Buffers::Chunk& buffers = static_cast<Buffers&>(*step.buffers).chunks[c];
  const std::int64_t hidden = config().hidden;
  EPMOE_CHECK_EQ(row_dweights.size(), chunk.entry_of_row.size(), "combine-weight gradients of chunk ", c,
                 ": one per row received");
  buffers.entry_dweights.assign(row_dweights.size(), 0.0f);
  for (std::size_t r = 0; r < row_dweights.size(); ++r) buffers.entry_dweights[chunk.entry_of_row[r]] = row_dweights[r];
  chunk.slot_dx = std::move(slot_dx);
  count_bytes(step, "backward/all_to_all_v dx", chunk.rows_in_elements, wire_element_bytes());
  count_bytes(step, "backward/all_to_all_v dweights", chunk.recv_entries_per_rank, 4);
  buffers.dx_back.resize(chunk.send_row_token.size() * hidden);
  buffers.dweights_back.resize(chunk.send_entry_pair.size());
  if (bf16_wire()) {
    to_wire(chunk.slot_dx.data<float>(), chunk.slot_dx.numel(), buffers.dx_out);
    buffers.dx_in.resize(buffers.dx_back.size());
  }
  chunk.dx_in_flight = comm::all_to_all_v(
      comm(), {.input = bf16_wire() ? static_cast<const void*>(buffers.dx_out.data()) : chunk.slot_dx.raw(),
               .send_counts = chunk.rows_in_elements,
               .dtype = wire_dtype(),
               .known_recv_counts = &chunk.rows_out_elements,
               .recv_buffer = bf16_wire() ? static_cast<void*>(buffers.dx_in.data()) : buffers.dx_back.data(),
               .tag = ep_tag(step.tag_base, c, EpOp::backward_dx),
               .timeout = config().timeout});
  chunk.dweights_in_flight = comm::all_to_all_v(comm(), {.input = buffers.entry_dweights.data(),
                                                         .send_counts = chunk.recv_entries_per_rank,
                                                         .dtype = DType::f32,
                                                         .known_recv_counts = &chunk.send_entries_per_rank,
                                                         .recv_buffer = buffers.dweights_back.data(),
                                                         .tag = ep_tag(step.tag_base, c, EpOp::backward_dweights),
                                                         .timeout = config().timeout});
}

void AllToAllDispatcher::finish_gradients(StepState& base, int c, float* dx, float* d_topk_weights) {
  Step& step = static_cast<Step&>(base);
  Step::Chunk& chunk = step.chunks[c];
  Buffers::Chunk& buffers = static_cast<Buffers&>(*step.buffers).chunks[c];
  chunk.dx_in_flight.wait();
  chunk.dweights_in_flight.wait();
  if (bf16_wire()) from_wire(buffers.dx_in, buffers.dx_back.data());
  sum_rows_into_tokens(buffers.dx_back.data(), chunk.send_row_token, chunk.range, config().hidden, dx);
  // Pairs a capacity dropped keep a zero weight gradient.
  const int top_k = step.top_k;
  std::fill(d_topk_weights + chunk.range.begin * top_k, d_topk_weights + chunk.range.end * top_k, 0.0f);
  for (std::size_t j = 0; j < chunk.send_entry_pair.size(); ++j)
    d_topk_weights[chunk.send_entry_pair[j]] = buffers.dweights_back[j];
  chunk.slot_dx = Tensor();
}

}  // namespace epmoe::ep
