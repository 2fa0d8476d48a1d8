#include "ep/token_codec.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "comm/all_gather.h"

#include "core/finite_check.h"
#include "core/threading.h"
#include "kernels/convert.h"

namespace epmoe::ep {

TokenCodec::TokenCodec(TokenFormat format, std::int64_t hidden) : format_(format), hidden_(hidden) {}

std::int64_t TokenCodec::row_bytes() const {
  switch (format_) {
    case TokenFormat::f32:
      return hidden_ * 4;
    case TokenFormat::fp8_tensor:
      return hidden_;
    case TokenFormat::fp8_token:
      return hidden_ + 4;
    case TokenFormat::bf16:
      return hidden_ * 2;
  }
  return 0;
}

float absmax(const float* values, std::int64_t n) {
  // std::max(m, NaN) keeps m, so a NaN would vanish from a plain max.
  if (find_non_finite({values, static_cast<std::size_t>(n)}) >= 0) return std::numeric_limits<float>::infinity();
  float m = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(values[i]));
  return m;
}

float fp8_scale_for(float max_magnitude) {
  if (!std::isfinite(max_magnitude))
    throw NumericError("fp8 token scale: the absmax is " + value_to_string(max_magnitude) +
                       ", so no finite scale exists; fp8 e4m3 tokens must be finite");
  return max_magnitude > 0 ? max_magnitude / kFp8E4m3Max : 1.0f;
}

void TensorScales::start(transport::Communicator& comm, const float* rows, std::int64_t hidden,
                         std::vector<std::int64_t> chunk_begin, std::uint32_t tag, std::chrono::milliseconds timeout) {
  EPMOE_CHECK(collected_);  // the previous step's scales were all taken
  num_ranks_ = comm.size();
  num_chunks_ = static_cast<int>(chunk_begin.size()) - 1;
  rows_ = rows;
  hidden_ = hidden;
  chunk_begin_ = std::move(chunk_begin);
  // A non-finite value travels as an absmax of inf, so every rank sees it in
  // the gathered maxima and throws, instead of one rank throwing here and
  // leaving its peers waiting in the all-gather.
  local_max_.resize(static_cast<std::size_t>(num_chunks_));
  for (int c = 0; c < num_chunks_; ++c)
    local_max_[c] = absmax(rows + chunk_begin_[c] * hidden, (chunk_begin_[c + 1] - chunk_begin_[c]) * hidden);
  all_max_.resize(static_cast<std::size_t>(num_ranks_) * num_chunks_);
  in_flight_ = comm::ring_all_gather(comm, {.input = local_max_.data(),
                                            .output = all_max_.data(),
                                            .num_elements_per_rank = num_chunks_,
                                            .tag = tag,
                                            .timeout = timeout});
  collected_ = false;
}

void TensorScales::collect() {
  collected_ = true;
  in_flight_.wait();
  scales_.assign(static_cast<std::size_t>(num_chunks_), 1.0f);
  for (int c = 0; c < num_chunks_; ++c) {
    float global_max = 0;
    for (int r = 0; r < num_ranks_; ++r) {
      const float rank_max = all_max_[static_cast<std::size_t>(r) * num_chunks_ + c];
      if (!std::isfinite(rank_max)) {
        std::string message = "fp8_tokens=tensor: rank " + std::to_string(r) +
                              "'s tokens hold a non-finite value, so no finite per-tensor scale exists";
        const float* rows = rows_ + chunk_begin_[c] * hidden_;
        const std::int64_t n = (chunk_begin_[c + 1] - chunk_begin_[c]) * hidden_;
        const std::int64_t index = find_non_finite({rows, static_cast<std::size_t>(n)});
        if (index >= 0) {
          message += " (value " + std::to_string(index) + " of this rank's chunk" +
                     (num_chunks_ > 1 ? " " + std::to_string(c) : std::string()) + " = " +
                     value_to_string(rows[index]) + ")";
        }
        throw NumericError(message + "; fp8 e4m3 tokens must be finite");
      }
      global_max = std::max(global_max, rank_max);
    }
    scales_[c] = fp8_scale_for(global_max);
  }
}

float TensorScales::scale(int chunk) {
  if (!collected_) collect();
  EPMOE_CHECK(chunk >= 0 && chunk < static_cast<int>(scales_.size()));
  return scales_[chunk];
}

float agree_on_tensor_scale(transport::Communicator& comm, const float* rows, std::int64_t num_values,
                            std::uint32_t tag, std::chrono::milliseconds timeout) {
  // Rows of one value each: the chunk is all of them.
  TensorScales scales;
  scales.start(comm, rows, 1, {0, num_values}, tag, timeout);
  return scales.scale(0);
}

void TokenCodec::encode(const float* rows, const std::int64_t* row_index, std::int64_t num_rows, float tensor_scale,
                        std::byte* out) const {
  const std::int64_t row_size = row_bytes(), hidden = hidden_;
  // The first rows[row] holding a non-finite value (fp8 only), reported after
  // the parallel loop: an exception may not leave an OpenMP region.
  std::atomic<std::int64_t> first_bad_row{std::numeric_limits<std::int64_t>::max()};
  parallel_for(num_rows, 64, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const std::int64_t row = row_index ? row_index[i] : i;
      const float* src = rows + row * hidden;
      std::byte* dst = out + i * row_size;
      if (format_ == TokenFormat::f32) {
        std::memcpy(dst, src, static_cast<std::size_t>(row_size));
        continue;
      }
      if (format_ == TokenFormat::bf16) {  // rounded to nearest even, as the bf16 GEMM operands are
        auto* values = reinterpret_cast<bf16_t*>(dst);
        for (std::int64_t j = 0; j < hidden; ++j) values[j] = float_to_bf16(src[j]);
        continue;
      }
      if (find_non_finite({src, static_cast<std::size_t>(hidden)}) >= 0) {
        std::int64_t seen = first_bad_row.load(std::memory_order_relaxed);
        while (row < seen && !first_bad_row.compare_exchange_weak(seen, row, std::memory_order_relaxed)) {
        }
        continue;
      }
      const float scale = format_ == TokenFormat::fp8_token ? fp8_scale_for(absmax(src, hidden)) : tensor_scale;
      const float inverse = 1.0f / scale;
      auto* bytes = reinterpret_cast<fp8_e4m3_t*>(dst);
      for (std::int64_t j = 0; j < hidden; ++j) bytes[j] = float_to_fp8_e4m3(src[j] * inverse);
      if (format_ == TokenFormat::fp8_token) std::memcpy(dst + hidden, &scale, sizeof scale);
    }
  });
  const std::int64_t bad_row = first_bad_row.load();
  if (bad_row != std::numeric_limits<std::int64_t>::max()) {
    const float* src = rows + bad_row * hidden;
    const std::int64_t j = find_non_finite({src, static_cast<std::size_t>(hidden)});
    throw NumericError("fp8_tokens=" + to_string(format_) + ": token row " + std::to_string(bad_row) + " holds " +
                       value_to_string(src[j]) + " at element " + std::to_string(j) +
                       ": fp8 e4m3 tokens must be finite");
  }
}

void TokenCodec::decode(const std::byte* in, std::int64_t num_rows, float tensor_scale, float* out) const {
  const std::int64_t row_size = row_bytes(), hidden = hidden_;
  parallel_for(num_rows, 64, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const std::byte* src = in + i * row_size;
      float* dst = out + i * hidden;
      if (format_ == TokenFormat::f32) {
        std::memcpy(dst, src, static_cast<std::size_t>(row_size));
        continue;
      }
      if (format_ == TokenFormat::bf16) {  // exact: every bf16 is an f32
        const auto* values = reinterpret_cast<const bf16_t*>(src);
        for (std::int64_t j = 0; j < hidden; ++j) dst[j] = bf16_to_float(values[j]);
        continue;
      }
      float scale = tensor_scale;
      if (format_ == TokenFormat::fp8_token) std::memcpy(&scale, src + hidden, sizeof scale);
      const auto* bytes = reinterpret_cast<const fp8_e4m3_t*>(src);
      for (std::int64_t j = 0; j < hidden; ++j) dst[j] = fp8_e4m3_to_float(bytes[j]) * scale;
    }
  });
}

}  // namespace epmoe::ep
