// SavedExpertRows: x_sorted as MoeLayer keeps it from the forward to the
// backward when the remat policy saves it: in the narrowest form that gives
// the backward exactly the values the forward computed on (the rows as they
// travelled with fp8 tokens, bf16 for bf16 GEMM operands, else f32; see
// core/x_sorted_size.h), charged to the ledger under "saved/x_sorted" at
// exactly the size that header defines (checked against what is held).
#pragma once

#include <cstdint>

#include "core/memory_ledger.h"
#include "core/x_sorted_size.h"
#include "ep/expert_rows.h"
#include "kernels/compute_dtype.h"

namespace epmoe {

class SavedExpertRows {
 public:
  SavedExpertRows() = default;
  // Keeps `rows` (their x decoded from rows.transfer when they travelled in
  // fp8) for the backward; `ledger` may be null.
  SavedExpertRows(ep::ExpertRows rows, std::int64_t hidden, ComputeDType compute_dtype, MemoryLedger* ledger);

  static SavedRowForm form_of(const ep::ExpertRows& rows, ComputeDType compute_dtype);
  // What keeping `rows` costs: the bytes the ledger is charged.
  static std::int64_t bytes_of(const ep::ExpertRows& rows, std::int64_t hidden, ComputeDType compute_dtype);

  // The rows with x as the forward computed on, bit for bit; once. The
  // charge stays until this object is reset (the chunk's backward is done).
  ep::ExpertRows restore();

 private:
  ep::ExpertRows rows_;  // x dropped unless the form is f32
  Tensor bf16_rows_;     // the bf16 form
  std::int64_t hidden_ = 0;
  SavedRowForm form_ = SavedRowForm::f32;
  LedgerCharge charge_;
};

}  // namespace epmoe
