// ExpertRows: the rows one rank's experts compute on, for one chunk of a
// step — the "x_sorted" bundle of DESIGN.md §4.7: the expert-sorted input
// rows plus the routing metadata needed to use them.
//
// Every row is one (token, expert) pair routed to a local expert. Rows are
// sorted by local expert (stable, so ties keep the dispatcher's order), and
// each row adds w * expert(x_row) into one output slot. What a slot is
// depends on the dispatcher: a token (single rank, ring of experts), a
// received message row (all-to-all: one per (token, k) pair, or with dedup
// one per (token, rank)).
#pragma once

#include <cstdint>
#include <vector>

#include <span>

#include <epmoe/config.h>
#include "core/tensor.h"

namespace epmoe::ep {

// Rows as they travelled in an fp8 format (TokenCodec), in the order of the
// decoded rows they came with.
struct TransferRows {
  std::vector<std::byte> bytes;  // [num_rows, row_bytes]
  TokenFormat format = TokenFormat::f32;
  float tensor_scale = 1.0f;  // fp8_tensor
};

struct ExpertRows {
  Tensor x;                               // [num_rows, H] f32, sorted by local expert
  std::vector<std::int64_t> group_sizes;  // [num_local_experts], summing to num_rows
  std::vector<float> weights;             // [num_rows] routing weight of each row
  std::vector<std::int64_t> slot_of_row;  // [num_rows] output slot each row adds into
  std::int64_t num_slots = 0;             // rows of this chunk's slot outputs
  // fp8 tokens: the rows as they travelled, x being exactly their decoding,
  // so the layer can keep x_sorted in that form (moe/saved_expert_rows.h).
  // Empty when the rows travelled as f32.
  TransferRows transfer;

  std::int64_t num_rows() const { return static_cast<std::int64_t>(weights.size()); }
  // Bytes of the routing metadata (weights, slots, group sizes).
  std::int64_t metadata_bytes() const;
};

}  // namespace epmoe::ep

namespace epmoe::ep {

class TokenCodec;

// Entries routed to this rank's experts, in the dispatcher's order; entry i
// reads row source_row[i] of a [*, H] source matrix.
struct RowEntries {
  std::vector<std::int32_t> local_expert;
  std::vector<float> weight;
  std::vector<std::int64_t> slot;
  std::vector<std::int64_t> source_row;

  void reserve(std::size_t n);
  void add(std::int32_t expert, float w, std::int64_t slot_index, std::int64_t row) {
    local_expert.push_back(expert);
    weight.push_back(w);
    slot.push_back(slot_index);
    source_row.push_back(row);
  }
  std::size_t size() const { return local_expert.size(); }
};

// Sorts the entries by local expert (stable) and gathers their rows.
// `entry_of_row` (optional) receives, per sorted row, its entry index.
ExpertRows build_expert_rows(const float* source, std::int64_t hidden, const RowEntries& entries, int num_local_experts,
                             std::int64_t num_slots, std::vector<std::int64_t>* entry_of_row);
// The same for received rows in `codec`'s format, source row i at
// row_address[i]: the sorted rows are gathered as they travelled (into
// rows.transfer when fp8) and decoded into rows.x.
ExpertRows build_expert_rows(const TokenCodec& codec, float tensor_scale, std::span<const std::byte* const> row_address,
                             const RowEntries& entries, int num_local_experts, std::int64_t num_slots,
                             std::vector<std::int64_t>* entry_of_row);

}  // namespace epmoe::ep
