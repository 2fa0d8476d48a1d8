#include "ep/expert_rows.h"
#include "core/modelled_clock.h"

#include <cstring>

#include "core/error.h"
#include "core/threading.h"
#include "ep/token_codec.h"
#include "kernels/permute.h"

namespace epmoe::ep {

std::int64_t ExpertRows::metadata_bytes() const {
  return static_cast<std::int64_t>(group_sizes.size() * sizeof(std::int64_t) + weights.size() * sizeof(float) +
                                   slot_of_row.size() * sizeof(std::int64_t));
}

void RowEntries::reserve(std::size_t n) {
  local_expert.reserve(n);
  weight.reserve(n);
  slot.reserve(n);
  source_row.reserve(n);
}

namespace {

// The sorted rows' metadata; source_of_row receives each sorted row's source row.
ExpertRows sorted_metadata(const RowEntries& entries, int num_local_experts, std::int64_t num_slots,
                           std::vector<std::int64_t>& source_of_row, std::vector<std::int64_t>* entry_of_row) {
  const ExpertPermutation perm = sort_by_expert(entries.local_expert, num_local_experts);
  const std::int64_t num_rows = static_cast<std::int64_t>(entries.size());
  ExpertRows rows;
  rows.num_slots = num_slots;
  rows.group_sizes = perm.group_sizes;
  rows.weights.resize(entries.size());
  rows.slot_of_row.resize(entries.size());
  source_of_row.resize(entries.size());
  for (std::int64_t r = 0; r < num_rows; ++r) {
    const std::int64_t entry = perm.sorted_to_pair[r];
    rows.weights[r] = entries.weight[entry];
    rows.slot_of_row[r] = entries.slot[entry];
    source_of_row[r] = entries.source_row[entry];
    EPMOE_DCHECK_LT(rows.slot_of_row[r], num_slots);
  }
  if (entry_of_row != nullptr) *entry_of_row = perm.sorted_to_pair;
  return rows;
}

}  // namespace

ExpertRows build_expert_rows(const float* source, std::int64_t hidden, const RowEntries& entries, int num_local_experts,
                             std::int64_t num_slots, std::vector<std::int64_t>* entry_of_row) {
  std::vector<std::int64_t> source_of_row;
  ExpertRows rows = sorted_metadata(entries, num_local_experts, num_slots, source_of_row, entry_of_row);
  rows.x = Tensor(DType::f32, {rows.num_rows(), hidden});
  gather_rows(source, source_of_row, rows.x.data<float>(), hidden);
  return rows;
}

ExpertRows build_expert_rows(const TokenCodec& codec, float tensor_scale, std::span<const std::byte* const> row_address,
                             const RowEntries& entries, int num_local_experts, std::int64_t num_slots,
                             std::vector<std::int64_t>* entry_of_row) {
  std::vector<std::int64_t> source_of_row;
  ExpertRows rows = sorted_metadata(entries, num_local_experts, num_slots, source_of_row, entry_of_row);
  const std::int64_t num_rows = rows.num_rows(), row_bytes = codec.row_bytes();
  rows.x = Tensor(DType::f32, {num_rows, codec.hidden()});
  // f32 rows are gathered straight into x; fp8 and bf16 rows into the transfer form,
  // then decoded (one pass over the sorted rows).
  std::byte* gathered = reinterpret_cast<std::byte*>(rows.x.raw());
  if (codec.is_encoded()) {
    rows.transfer = {.bytes = std::vector<std::byte>(static_cast<std::size_t>(num_rows * row_bytes)),
                     .format = codec.format(),
                     .tensor_scale = tensor_scale};
    gathered = rows.transfer.bytes.data();
  }
  {
    // The expert-order row gather (what saving x_sorted avoids), in the
    // rows' wire format: read and written once.
    const ComputeScope charge("gather rows", {.bytes = 2.0 * static_cast<double>(num_rows * row_bytes)});
    parallel_for(num_rows, 256, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) {
        const std::int64_t source = source_of_row[r];
        EPMOE_DCHECK_LT(source, static_cast<std::int64_t>(row_address.size()));
        std::memcpy(gathered + r * row_bytes, row_address[source], static_cast<std::size_t>(row_bytes));
      }
    });
  }
  if (codec.is_encoded()) {
    // Wire-format rows read, f32 rows written.
    const ComputeScope charge("token decode",
                              {.bytes = static_cast<double>(num_rows) * (row_bytes + 4.0 * codec.hidden())});
    codec.decode(rows.transfer.bytes.data(), num_rows, tensor_scale, rows.x.data<float>());
  }
  return rows;
}

}  // namespace epmoe::ep
