// The size of a saved x_sorted bundle (DESIGN.md §4.7): one definition for
// the engine, which charges it to its ledger under "saved/x_sorted"
// (moe/saved_expert_rows.h), and for the projection (plan/), which sizes
// the same bundle at scale. It lives below both.
//
// The rows are kept in the narrowest form that gives the backward exactly
// the values the forward computed on:
//  * fp8_tensor, fp8_token: as they travelled (fp8_tokens=tensor|token):
//    e4m3 bytes, plus an f32 scale per row (token) or one per chunk (tensor);
//    the forward computed on their decoding, so decoding again is exact;
//  * bf16: when the rows travelled as bf16 (fp8_tokens=bf16: they are bf16
//    values), or the GEMMs take bf16 operands and the rows travelled as f32
//    (every use of x_sorted in the backward rounds it to bf16 first);
//  * f32: otherwise.
// Plus the routing metadata: per row an f32 weight and an i64 output slot,
// per expert group an i64 size.
#pragma once

#include <cstdint>

namespace epmoe {

enum class SavedRowForm { f32, bf16, fp8_tensor, fp8_token };

// Bytes of one saved row of `hidden` values.
constexpr double saved_row_bytes(SavedRowForm form, std::int64_t hidden) {
  const double h = double(hidden);
  switch (form) {
    case SavedRowForm::f32:
      return 4 * h;
    case SavedRowForm::bf16:
      return 2 * h;
    case SavedRowForm::fp8_tensor:
      return h;
    case SavedRowForm::fp8_token:
      return h + 4;
  }
  return 0;
}

// One chunk's bundle: `rows` rows over `num_groups` expert groups.
constexpr double x_sorted_bundle_bytes(double rows, SavedRowForm form, std::int64_t hidden, std::int64_t num_groups) {
  return rows * (saved_row_bytes(form, hidden) + 12) + 8 * double(num_groups) +
         (form == SavedRowForm::fp8_tensor ? 4 : 0);
}

}  // namespace epmoe
