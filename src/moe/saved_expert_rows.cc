#include "moe/saved_expert_rows.h"

#include <utility>

#include "core/error.h"
#include "ep/token_codec.h"
#include "kernels/convert.h"

namespace epmoe {

SavedRowForm SavedExpertRows::form_of(const ep::ExpertRows& rows, ComputeDType compute_dtype) {
  if (rows.transfer.format == TokenFormat::fp8_tensor) return SavedRowForm::fp8_tensor;
  if (rows.transfer.format == TokenFormat::fp8_token) return SavedRowForm::fp8_token;
  // Rows that travelled as bf16 are bf16 values: kept as bf16, exactly.
  if (rows.transfer.format == TokenFormat::bf16) return SavedRowForm::bf16;
  return compute_dtype == ComputeDType::bf16 ? SavedRowForm::bf16 : SavedRowForm::f32;
}

std::int64_t SavedExpertRows::bytes_of(const ep::ExpertRows& rows, std::int64_t hidden, ComputeDType compute_dtype) {
  return static_cast<std::int64_t>(x_sorted_bundle_bytes(double(rows.num_rows()), form_of(rows, compute_dtype), hidden,
                                                         static_cast<std::int64_t>(rows.group_sizes.size())));
}

SavedExpertRows::SavedExpertRows(ep::ExpertRows rows, std::int64_t hidden, ComputeDType compute_dtype,
                                 MemoryLedger* ledger)
    : rows_(std::move(rows)), hidden_(hidden), form_(form_of(rows_, compute_dtype)) {
  const std::int64_t num_rows = rows_.num_rows();
  EPMOE_CHECK_EQ(rows_.x.numel(), num_rows * hidden_);
  std::int64_t held = rows_.metadata_bytes();
  switch (form_) {
    case SavedRowForm::fp8_tensor:
    case SavedRowForm::fp8_token:
      rows_.x = Tensor();  // x is the transfer form's decoding: restore() decodes it again
      held += static_cast<std::int64_t>(rows_.transfer.bytes.size()) +
              (form_ == SavedRowForm::fp8_tensor ? std::int64_t{sizeof(float)} : 0);
      break;
    case SavedRowForm::bf16:
      bf16_rows_ = Tensor(DType::bf16, {num_rows, hidden_});
      convert(rows_.x.span<float>(), bf16_rows_.span<bf16_t>());
      rows_.x = Tensor();
      rows_.transfer.bytes = {};  // fp8_tokens=bf16: the same values, held once
      held += bf16_rows_.size_bytes();
      break;
    case SavedRowForm::f32:
      held += rows_.x.size_bytes();
      break;
  }
  // What is held is what core/x_sorted_size.h says, the plan's definition too.
  EPMOE_CHECK_EQ(held, bytes_of(rows_, hidden_, compute_dtype));
  charge_ = LedgerCharge(ledger, "saved/x_sorted", held);
}

ep::ExpertRows SavedExpertRows::restore() {
  const std::int64_t num_rows = rows_.num_rows();
  switch (form_) {
    case SavedRowForm::fp8_tensor:
    case SavedRowForm::fp8_token:
      rows_.x = Tensor(DType::f32, {num_rows, hidden_});
      ep::TokenCodec(rows_.transfer.format, hidden_)
          .decode(rows_.transfer.bytes.data(), num_rows, rows_.transfer.tensor_scale, rows_.x.data<float>());
      break;
    case SavedRowForm::bf16:
      rows_.x = Tensor(DType::f32, {num_rows, hidden_});
      convert(bf16_rows_.span<bf16_t>(), rows_.x.span<float>());
      bf16_rows_ = Tensor();
      break;
    case SavedRowForm::f32:
      break;
  }
  return std::move(rows_);
}

}  // namespace epmoe
