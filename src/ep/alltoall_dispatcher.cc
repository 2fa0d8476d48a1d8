#include "ep/alltoall_dispatcher.h"

#include <cmath>
#include <cstring>

#include "comm/all_gather.h"
#include "comm/all_to_all_v.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "ep/collective_tags.h"

namespace epmoe::ep {

// One chunk's exchange state. "Send" is this rank's tokens going out (and
// their results coming back); "recv" is other ranks' tokens arriving here.
// Chunks live as long as the dispatcher and their vectors keep their
// capacity from step to step (cleared, never freed): after the first steps a
// step allocates nothing and touches no fresh page (core/buffer_cache.h says
// what a fresh page costs here). The forward's counts size everything after
// it: the combine, the remat re-send and the whole backward exchange with
// known counts (no count round) into these buffers.
struct AllToAllDispatcher::Chunk {
  ChunkRange range;
  // Send side, grouped by destination rank.
  std::vector<std::int64_t> send_row_token;       // local token of each row
  std::vector<std::int64_t> send_rows_per_rank;   // [R]
  std::vector<std::int64_t> send_entry_pair;      // pair (t * K + k) of each entry
  std::vector<std::int64_t> send_words_per_rank;  // [R] routing words
  std::vector<std::int32_t> send_metadata;        // routing words, by destination
  std::vector<std::byte> send_message;            // per destination: routing words, then token rows
  std::vector<std::int64_t> send_message_counts;  // [R] bytes
  float tensor_scale = 1.0f;
  // Receive side, grouped by source rank.
  std::vector<std::byte> recv_message;
  std::vector<std::int64_t> recv_message_counts;  // [R] bytes, learnt by the forward's exchange
  std::vector<std::int64_t> recv_rows_per_rank, recv_entries_per_rank;
  std::vector<std::int64_t> entry_of_row;  // expert row -> received entry
  // Element counts per rank, known from the forward's exchange: rows out
  // (this rank's rows at each destination) and rows in (each source's rows
  // here), times H; entries out, per destination.
  std::vector<std::int64_t> rows_out_elements, rows_in_elements, send_entries_per_rank;
  comm::CollectiveHandle message_in_flight;
  bool dispatch_started = false;
  // Combine: outputs go back to their sources.
  Tensor slot_outputs;
  std::vector<float> combined;
  comm::CollectiveHandle combine_in_flight;
  // Backward.
  std::vector<float> send_dy;
  Tensor recv_dy;  // [rows in, H], handed to the experts as they are
  comm::CollectiveHandle cotangent_in_flight;
  bool cotangent_started = false;
  Tensor slot_dx;
  std::vector<float> entry_dweights;
  std::vector<float> dx_back, dweights_back;
  comm::CollectiveHandle dx_in_flight, dweights_in_flight;

  // A new step: the vectors keep their capacity.
  void start_step(ChunkRange chunk_range) {
    range = chunk_range;
    send_row_token.clear();
    send_entry_pair.clear();
    send_metadata.clear();
    dispatch_started = cotangent_started = false;
  }

  // The vectors' capacity: what the chunk holds across steps. (The Tensors
  // are the step's: the layer's outputs and gradients coming in, and the
  // cotangent rows handed out to the experts.)
  std::int64_t capacity_bytes() const {
    return vector_capacity_bytes(send_row_token, send_rows_per_rank, send_entry_pair, send_words_per_rank,
                                 send_metadata, send_message, send_message_counts, recv_message, recv_message_counts,
                                 recv_rows_per_rank, recv_entries_per_rank, entry_of_row, rows_out_elements,
                                 rows_in_elements, send_entries_per_rank, combined, send_dy, entry_dweights, dx_back,
                                 dweights_back);
  }
};

AllToAllDispatcher::AllToAllDispatcher(transport::Communicator& comm, EpConfig config)
    : comm_(comm),
      config_(std::move(config)),
      num_local_experts_((config_.validate(comm.size()), config_.num_experts / comm.size())),
      codec_(config_.token_format, config_.hidden) {
  stats_.reset(num_local_experts_);
  if (config_.replicas_enabled()) replicas_ = std::make_unique<ReplicaExchange>(comm_, config_, &stats_.bytes_sent);
}

AllToAllDispatcher::~AllToAllDispatcher() = default;

void AllToAllDispatcher::count_bytes(const char* name, const std::vector<std::int64_t>& counts,
                                     std::int64_t element_bytes) {
  std::int64_t bytes = 0;
  for (int r = 0; r < comm_.size(); ++r)
    if (r != comm_.rank()) bytes += counts[r] * element_bytes;
  stats_.bytes_sent[name] += bytes;
}

void AllToAllDispatcher::start_forward(TensorView x, const RoutingView& routing) {
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
  y_ = Tensor::zeros(DType::f32, {x.dim(0), x.dim(1)});
  while (static_cast<int>(chunks_.size()) < config_.num_chunks) chunks_.push_back(std::make_unique<Chunk>());
  for (int c = 0; c < config_.num_chunks; ++c)
    chunks_[c]->start_step(chunk_range(routing.num_tokens, config_.num_chunks, c));
  if (replicas_) {
    ScopedPhase phase(stats_.phase_seconds, "balance");
    replicas_->plan_step(routing);
    // With dedup, dedup-aware (ReplicaExchange::local_destinations). Nothing
    // downstream assumes the positional rule: receivers take the local
    // expert from the routing words, rows_per_slot counts received rows, and
    // a remat re-sends this chunk's saved send plan.
    pair_destination_ = replicas_->local_destinations(routing);
  }
  plan_chunk(0);
  send_tokens(0, /*remat=*/false);
}

// Which rows go where, with which routing words; the tensor scale for fp8.
void AllToAllDispatcher::plan_chunk(int c) {
  Chunk& chunk = *chunks_[c];
  chunk.dispatch_started = true;
  const int num_ranks = comm_.size(), top_k = config_.top_k;
  const std::int64_t hidden = config_.hidden;

  // Which pairs go where, in (token, k) order; capacity drops later tokens.
  // The per-destination lists are the dispatcher's scratch (capacity kept).
  PlanScratch& scratch = plan_scratch_;
  scratch.rows_to.resize(num_ranks);
  scratch.entries_to.resize(num_ranks);
  scratch.words_to.resize(num_ranks);
  for (int d = 0; d < num_ranks; ++d) {
    scratch.rows_to[d].clear();
    scratch.entries_to[d].clear();
    scratch.words_to[d].clear();
  }
  auto& rows_to = scratch.rows_to;
  auto& entries_to = scratch.entries_to;
  auto& words_to = scratch.words_to;
  std::vector<std::int64_t>& pairs_per_expert = scratch.pairs_per_expert;
  pairs_per_expert.assign(static_cast<std::size_t>(config_.num_experts), 0);
  const std::int64_t capacity =
      config_.capacity_factor > 0
          ? static_cast<std::int64_t>(
                std::ceil(config_.capacity_factor * double(chunk.range.size()) * top_k / config_.num_experts))
          : -1;
  std::vector<std::pair<int, std::int64_t>>& kept = scratch.kept;  // (dest, pair)
  for (std::int64_t t = chunk.range.begin; t < chunk.range.end; ++t) {
    // With dedup, one row per destination, entries in k order; without, one
    // row per pair.
    kept.clear();
    for (int k = 0; k < top_k; ++k) {
      const std::int64_t pair = t * top_k + k;
      const int expert = routing_.topk_ids[pair];
      EPMOE_CHECK(expert >= 0 && expert < config_.num_experts, "expert id of local token ", t, ", k ", k,
                  ": the router chose an expert outside [0, E)");
      if (capacity >= 0 && pairs_per_expert[expert] >= capacity) {
        stats_.dropped_pairs += 1;
        continue;
      }
      pairs_per_expert[expert] += 1;
      kept.emplace_back(replicas_ ? pair_destination_[pair].rank : expert / num_local_experts_, pair);
    }
    if (config_.dedup)
      std::stable_sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (std::size_t i = 0; i < kept.size();) {
      const int dest = kept[i].first;
      std::size_t j = i + 1;
      if (config_.dedup)
        while (j < kept.size() && kept[j].first == dest) ++j;
      rows_to[dest].push_back(t);
      words_to[dest].push_back(static_cast<std::int32_t>(j - i));
      for (std::size_t e = i; e < j; ++e) {
        const std::int64_t pair = kept[e].second;
        entries_to[dest].push_back(pair);
        std::int32_t weight_bits;
        std::memcpy(&weight_bits, &routing_.topk_weights[pair], sizeof weight_bits);
        words_to[dest].push_back(replicas_ ? pair_destination_[pair].local_expert
                                           : routing_.topk_ids[pair] - dest * num_local_experts_);
        words_to[dest].push_back(weight_bits);
      }
      i = j;
    }
  }
  chunk.send_rows_per_rank.assign(num_ranks, 0);
  chunk.send_words_per_rank.assign(num_ranks, 0);
  chunk.send_entries_per_rank.assign(num_ranks, 0);
  chunk.rows_out_elements.assign(num_ranks, 0);
  for (int d = 0; d < num_ranks; ++d) {
    chunk.send_rows_per_rank[d] = static_cast<std::int64_t>(rows_to[d].size());
    chunk.send_words_per_rank[d] = static_cast<std::int64_t>(words_to[d].size());
    chunk.send_entries_per_rank[d] = static_cast<std::int64_t>(entries_to[d].size());
    chunk.rows_out_elements[d] = chunk.send_rows_per_rank[d] * hidden;
    chunk.send_row_token.insert(chunk.send_row_token.end(), rows_to[d].begin(), rows_to[d].end());
    chunk.send_entry_pair.insert(chunk.send_entry_pair.end(), entries_to[d].begin(), entries_to[d].end());
    chunk.send_metadata.insert(chunk.send_metadata.end(), words_to[d].begin(), words_to[d].end());
  }

  if (config_.token_format == TokenFormat::fp8_tensor) chunk.tensor_scale = tensor_scales_.scale(c);
}

// One message per destination: its routing words, then its token rows
// (TokenCodec), in one all_to_all_v: one count round per chunk, not one for
// the tokens and one for the words. The receiver finds the boundary without
// a header (collect_rows).
void AllToAllDispatcher::send_tokens(int c, bool remat) {
  Chunk& chunk = *chunks_[c];
  const int num_ranks = comm_.size();
  const std::int64_t row_bytes = codec_.row_bytes();
  std::vector<std::int64_t>& message_counts = chunk.send_message_counts;
  message_counts.resize(num_ranks);
  std::int64_t message_bytes = 0;
  for (int d = 0; d < num_ranks; ++d) {
    message_counts[d] = 4 * chunk.send_words_per_rank[d] + chunk.send_rows_per_rank[d] * row_bytes;
    message_bytes += message_counts[d];
  }
  chunk.send_message.resize(static_cast<std::size_t>(message_bytes));
  std::byte* out = chunk.send_message.data();
  const std::int32_t* words = chunk.send_metadata.data();
  const std::int64_t* row_token = chunk.send_row_token.data();
  for (int d = 0; d < num_ranks; ++d) {
    const std::int64_t word_bytes = 4 * chunk.send_words_per_rank[d], rows = chunk.send_rows_per_rank[d];
    if (word_bytes > 0) std::memcpy(out, words, static_cast<std::size_t>(word_bytes));
    codec_.encode(x_.data<float>(), row_token, rows, chunk.tensor_scale, out + word_bytes);
    out += message_counts[d];
    words += chunk.send_words_per_rank[d];
    row_token += rows;
  }

  count_bytes(remat ? "backward/remat all_to_all_v tokens" : "forward/all_to_all_v tokens", chunk.send_rows_per_rank,
              row_bytes);
  count_bytes(remat ? "backward/remat all_to_all_v routing" : "forward/all_to_all_v routing", chunk.send_words_per_rank,
              4);
  // The forward's exchange learns the receive counts (one i64 to each peer
  // before the payload); a remat re-send knows them (the same rows as the
  // forward's, bit for bit).
  if (!remat) stats_.bytes_sent["forward/all_to_all_v counts"] += 8 * (comm_.size() - 1);
  chunk.message_in_flight =
      comm::all_to_all_v(comm_, {.input = chunk.send_message.data(),
                                 .send_counts = message_counts,
                                 .dtype = DType::fp8_e4m3,
                                 .output = &chunk.recv_message,
                                 .recv_counts = remat ? nullptr : &chunk.recv_message_counts,
                                 .known_recv_counts = remat ? &chunk.recv_message_counts : nullptr,
                                 .tag = ep_tag(config_.tag_base, c, remat ? EpOp::remat_tokens : EpOp::forward_tokens),
                                 .timeout = config_.timeout});
}

ExpertRows AllToAllDispatcher::receive_rows(int c) {
  Chunk& chunk = *chunks_[c];
  if (!chunk.dispatch_started) {
    plan_chunk(c);
    send_tokens(c, false);
  }
  ExpertRows rows = collect_rows(c, /*remat=*/false);
  // Prefetch: the next chunk's exchange runs while the experts compute this one.
  if (c + 1 < config_.num_chunks && !chunks_[c + 1]->dispatch_started) {
    plan_chunk(c + 1);
    send_tokens(c + 1, false);
  }
  stats_.count_rows(rows, num_local_experts_);
  if (replicas_) replicas_->count_slot_rows(rows);
  return rows;
}

ExpertRows AllToAllDispatcher::redispatch_rows(int c) {
  send_tokens(c, /*remat=*/true);
  return collect_rows(c, /*remat=*/true);
}

// Waits for chunk c's messages and sorts them into rows. The forward learns
// the chunk's layout here (rows and entries from each source); a remat
// re-collect only checks it: the backward's exchanges, in flight meanwhile,
// read it as their known counts.
ExpertRows AllToAllDispatcher::collect_rows(int c, bool remat) {
  Chunk& chunk = *chunks_[c];
  // Test hook (core/fault_injection.h): fail with the token exchange in flight.
  fault_point("dispatch", comm_.rank());
  chunk.message_in_flight.wait();

  // Each source's message is its routing words, per row [n, (local expert,
  // weight bits) x n], then its rows' tokens. The words end after the j-th
  // row exactly when the bytes left are j token rows: before the last row,
  // the bytes left are more (the remaining words plus all J > j rows). Words
  // are read with memcpy: a message starts at any byte offset.
  const int num_ranks = comm_.size();
  const std::int64_t row_bytes = codec_.row_bytes();
  const std::byte* message = chunk.recv_message.data();
  RowEntries entries;
  std::vector<std::int64_t>& rows_from = plan_scratch_.rows_from;
  std::vector<std::int64_t>& entries_from = plan_scratch_.entries_from;
  std::vector<std::int64_t>& tokens_at = plan_scratch_.tokens_at;
  rows_from.assign(num_ranks, 0);
  entries_from.assign(num_ranks, 0);
  tokens_at.assign(num_ranks, 0);
  auto read_word = [&](std::int64_t at) {
    std::int32_t word;
    std::memcpy(&word, message + at, sizeof word);
    return word;
  };
  std::int64_t begin = 0, row = 0;
  for (int s = 0; s < num_ranks; ++s) {
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
        EPMOE_CHECK(expert >= 0 && expert < num_compute_experts(), "chunk ", c, ": rank ", s,
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
  EPMOE_CHECK_EQ(begin, static_cast<std::int64_t>(chunk.recv_message.size()));
  const std::int64_t num_rows = row;
  std::vector<const std::byte*>& row_address = plan_scratch_.row_address;
  row_address.clear();
  for (int s = 0; s < num_ranks; ++s)
    for (std::int64_t i = 0; i < rows_from[s]; ++i) row_address.push_back(message + tokens_at[s] + i * row_bytes);

  if (remat) {
    EPMOE_CHECK(rows_from == chunk.recv_rows_per_rank && entries_from == chunk.recv_entries_per_rank, "chunk ", c,
                ": the recomputing re-send must bring the forward's rows and entries per rank");
  } else {
    chunk.recv_rows_per_rank = rows_from;
    chunk.recv_entries_per_rank = entries_from;
    chunk.rows_in_elements.resize(num_ranks);
    for (int s = 0; s < num_ranks; ++s) chunk.rows_in_elements[s] = rows_from[s] * config_.hidden;
  }
  ExpertRows rows = build_expert_rows(codec_, chunk.tensor_scale, row_address, entries, num_compute_experts(), num_rows,
                                      &chunk.entry_of_row);
  return rows;
}

void AllToAllDispatcher::send_outputs(int c, Tensor slot_outputs) {
  Chunk& chunk = *chunks_[c];
  std::int64_t total = 0;
  for (const std::int64_t count : chunk.rows_in_elements) total += count;
  EPMOE_CHECK_EQ(slot_outputs.numel(), total, "expert outputs of chunk ", c, ": one H-row per row received");
  chunk.slot_outputs = std::move(slot_outputs);
  count_bytes("forward/all_to_all_v combine", chunk.rows_in_elements, 4);
  chunk.combined.resize(chunk.send_row_token.size() * config_.hidden);
  chunk.combine_in_flight = comm::all_to_all_v(comm_, {.input = chunk.slot_outputs.raw(),
                                                       .send_counts = chunk.rows_in_elements,
                                                       .dtype = DType::f32,
                                                       .known_recv_counts = &chunk.rows_out_elements,
                                                       .recv_buffer = chunk.combined.data(),
                                                       .tag = ep_tag(config_.tag_base, c, EpOp::forward_combine),
                                                       .timeout = config_.timeout});
}

namespace {

// dst[token[i]] += rows[i] for i in order: the home side of a combine.
void add_rows_to_tokens(const float* rows, const std::vector<std::int64_t>& token, std::int64_t hidden, float* dst) {
  for (std::size_t i = 0; i < token.size(); ++i) {
    const float* src = rows + static_cast<std::int64_t>(i) * hidden;
    float* out = dst + token[i] * hidden;
    for (std::int64_t j = 0; j < hidden; ++j) out[j] += src[j];
  }
}

}  // namespace

Tensor AllToAllDispatcher::finish_forward() {
  for (auto& chunk : chunks_) {
    chunk->combine_in_flight.wait();
    add_rows_to_tokens(chunk->combined.data(), chunk->send_row_token, config_.hidden, y_.data<float>());
    chunk->slot_outputs = Tensor();
  }
  return std::move(y_);
}

void AllToAllDispatcher::start_backward(TensorView dy) {
  dy_ = dy;
  grads_ = {Tensor::zeros(DType::f32, {dy.dim(0), dy.dim(1)}),
            Tensor::zeros(DType::f32, {routing_.num_tokens, routing_.top_k})};
  start_cotangents(0);
}

void AllToAllDispatcher::start_cotangents(int c) {
  Chunk& chunk = *chunks_[c];
  chunk.cotangent_started = true;
  const std::int64_t hidden = config_.hidden;
  chunk.send_dy.resize(chunk.send_row_token.size() * hidden);
  for (std::size_t i = 0; i < chunk.send_row_token.size(); ++i)
    std::memcpy(&chunk.send_dy[i * hidden], dy_.data<float>() + chunk.send_row_token[i] * hidden,
                hidden * sizeof(float));
  count_bytes("backward/all_to_all_v cotangent", chunk.rows_out_elements, 4);
  std::int64_t rows_in = 0;
  for (const std::int64_t count : chunk.recv_rows_per_rank) rows_in += count;
  chunk.recv_dy = Tensor(DType::f32, {rows_in, hidden});
  chunk.cotangent_in_flight = comm::all_to_all_v(comm_, {.input = chunk.send_dy.data(),
                                                         .send_counts = chunk.rows_out_elements,
                                                         .dtype = DType::f32,
                                                         .known_recv_counts = &chunk.rows_in_elements,
                                                         .recv_buffer = chunk.recv_dy.raw(),
                                                         .tag = ep_tag(config_.tag_base, c, EpOp::backward_cotangent),
                                                         .timeout = config_.timeout});
}

Tensor AllToAllDispatcher::receive_cotangents(int c) {
  Chunk& chunk = *chunks_[c];
  if (!chunk.cotangent_started) start_cotangents(c);
  chunk.cotangent_in_flight.wait();
  if (c + 1 < config_.num_chunks && !chunks_[c + 1]->cotangent_started) start_cotangents(c + 1);
  return std::move(chunk.recv_dy);
}

void AllToAllDispatcher::send_gradients(int c, Tensor slot_dx, std::vector<float> row_dweights) {
  Chunk& chunk = *chunks_[c];
  const std::int64_t hidden = config_.hidden;
  EPMOE_CHECK_EQ(row_dweights.size(), chunk.entry_of_row.size(), "combine-weight gradients of chunk ", c,
                 ": one per row received");
  chunk.entry_dweights.assign(row_dweights.size(), 0.0f);
  for (std::size_t r = 0; r < row_dweights.size(); ++r) chunk.entry_dweights[chunk.entry_of_row[r]] = row_dweights[r];
  chunk.slot_dx = std::move(slot_dx);
  count_bytes("backward/all_to_all_v dx", chunk.rows_in_elements, 4);
  count_bytes("backward/all_to_all_v dweights", chunk.recv_entries_per_rank, 4);
  chunk.dx_back.resize(chunk.send_row_token.size() * hidden);
  chunk.dweights_back.resize(chunk.send_entry_pair.size());
  chunk.dx_in_flight = comm::all_to_all_v(comm_, {.input = chunk.slot_dx.raw(),
                                                  .send_counts = chunk.rows_in_elements,
                                                  .dtype = DType::f32,
                                                  .known_recv_counts = &chunk.rows_out_elements,
                                                  .recv_buffer = chunk.dx_back.data(),
                                                  .tag = ep_tag(config_.tag_base, c, EpOp::backward_dx),
                                                  .timeout = config_.timeout});
  chunk.dweights_in_flight = comm::all_to_all_v(comm_, {.input = chunk.entry_dweights.data(),
                                                        .send_counts = chunk.recv_entries_per_rank,
                                                        .dtype = DType::f32,
                                                        .known_recv_counts = &chunk.send_entries_per_rank,
                                                        .recv_buffer = chunk.dweights_back.data(),
                                                        .tag = ep_tag(config_.tag_base, c, EpOp::backward_dweights),
                                                        .timeout = config_.timeout});
}

std::int64_t AllToAllDispatcher::persistent_buffer_bytes() const {
  std::int64_t bytes = vector_capacity_bytes(plan_scratch_.pairs_per_expert, plan_scratch_.kept,
                                             plan_scratch_.rows_from, plan_scratch_.entries_from,
                                             plan_scratch_.tokens_at, plan_scratch_.row_address, pair_destination_);
  for (std::size_t d = 0; d < plan_scratch_.rows_to.size(); ++d)
    bytes += vector_capacity_bytes(plan_scratch_.rows_to[d], plan_scratch_.entries_to[d], plan_scratch_.words_to[d]);
  for (const auto& chunk : chunks_) bytes += chunk->capacity_bytes();
  return bytes;
}

DispatchGradients AllToAllDispatcher::finish_backward() {
  for (auto& chunk : chunks_) {
    chunk->dx_in_flight.wait();
    chunk->dweights_in_flight.wait();
    add_rows_to_tokens(chunk->dx_back.data(), chunk->send_row_token, config_.hidden, grads_.dx.data<float>());
    for (std::size_t j = 0; j < chunk->send_entry_pair.size(); ++j)
      grads_.d_topk_weights.data<float>()[chunk->send_entry_pair[j]] = chunk->dweights_back[j];
    chunk->slot_dx = Tensor();
  }
  return std::move(grads_);
}

}  // namespace epmoe::ep
