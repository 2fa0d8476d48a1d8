// TokenCodec: how token rows travel (key fp8_tokens). f32 rows go as they
// are; bf16 rows are rounded to nearest even (2 bytes per value, no scale);
// fp8 rows are e4m3 bytes with a scale, so that the largest magnitude
// maps to 448 (e4m3's max): one scale per tensor (the global absmax, which
// the dispatcher agrees on with its peers) or one per token (stored as 4
// bytes after the row's H bytes). A row of all zeros gets scale 1.
//
// Non-finite values are refused, not encoded (NumericError): e4m3fn has no
// infinity, so an inf would either saturate to ±448·s silently or, through
// an absmax of inf, give scale inf and turn every value of the tensor (or
// the token) into NaN. MoeLayer refuses non-finite x before dispatch, so
// these errors fire only for callers that use the codec directly:
//  * encode (both fp8 formats): "fp8_tokens=token: token row 3 holds inf at
//    element 17: fp8 e4m3 tokens must be finite" (the row of `rows`);
//  * agree_on_tensor_scale: every rank learns, through the all-gather that
//    agrees on the scale, that some rank holds a non-finite value, and every
//    rank throws (no rank is left waiting): "fp8_tokens=tensor: rank 2's
//    tokens hold a non-finite value, so no finite per-tensor scale exists
//    (value 5 of this rank's chunk = nan); fp8 e4m3 tokens must be finite".
//
// Error of an fp8 round trip (derived in docs/NUMERICS.md): with scale
// s = absmax / 448, |decode(encode(v)) - v| <= 2^-4 |v| + 2^-10 s
// (relative rounding of a normal e4m3 value, plus half the subnormal step
// 2^-9 s for values below 2^-6 s).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <epmoe/config.h>
#include "comm/collective_handle.h"
#include "transport/communicator.h"

namespace epmoe::ep {

class TokenCodec {
 public:
  TokenCodec(TokenFormat format, std::int64_t hidden);

  TokenFormat format() const { return format_; }
  std::int64_t hidden() const { return hidden_; }
  // Rows travel in another form than the f32 they are computed in (fp8, bf16).
  bool is_encoded() const { return format_ != TokenFormat::f32; }
  std::int64_t row_bytes() const;

  // Encodes rows[row_index[i]] (or rows[i] when row_index is null) into
  // out[i * row_bytes()]. tensor_scale is used by fp8_tensor only.
  void encode(const float* rows, const std::int64_t* row_index, std::int64_t num_rows, float tensor_scale,
              std::byte* out) const;
  void decode(const std::byte* in, std::int64_t num_rows, float tensor_scale, float* out) const;

 private:
  TokenFormat format_;
  std::int64_t hidden_;
};

// max |v|; +inf when any value is NaN or ±inf (never a NaN dropped by max).
float absmax(const float* values, std::int64_t n);
// The scale that maps `max_magnitude` to e4m3's largest value (1 for zero).
// Throws NumericError for a non-finite max_magnitude (no finite scale fits).
float fp8_scale_for(float max_magnitude);

// fp8_tokens=tensor: the scale every rank uses for each chunk of a step, from
// the global absmax of the chunk's rows. Every chunk's local maximum goes out
// in one all-gather at the step's start (num_chunks floats per rank), which
// moves while the dispatcher plans; scale(c) waits for it the first time.
// One round per step instead of one blocking round per chunk, the same
// scales bit for bit. A non-finite value makes every rank throw from
// scale(), naming the rank (and, on that rank, the value).
class TensorScales {
 public:
  // rows [num_tokens, hidden]; chunk c holds tokens [chunk_begin[c],
  // chunk_begin[c + 1]). rows must stay unchanged until the last scale().
  void start(transport::Communicator& comm, const float* rows, std::int64_t hidden,
             std::vector<std::int64_t> chunk_begin, std::uint32_t tag, std::chrono::milliseconds timeout);
  float scale(int chunk);

 private:
  void collect();
  int num_ranks_ = 0, num_chunks_ = 0;
  const float* rows_ = nullptr;
  std::int64_t hidden_ = 0;
  std::vector<std::int64_t> chunk_begin_;
  std::vector<float> local_max_, all_max_, scales_;
  comm::CollectiveHandle in_flight_;
  bool collected_ = true;
};

// One chunk's scale, blocking (TensorScales with one chunk).
float agree_on_tensor_scale(transport::Communicator& comm, const float* rows, std::int64_t num_values,
                            std::uint32_t tag, std::chrono::milliseconds timeout);

}  // namespace epmoe::ep
