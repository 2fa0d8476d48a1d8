// all_reduce: every rank ends with the element-wise sum of every rank's data,
// in place. Bidirectional ring reduce-scatter (fixed summation order,
// comm/ring.h) of R near-equal blocks followed by the bidirectional ring
// all-gather of the summed blocks, so every rank holds the same bits. dtype f32 or bf16 (sums
// in f32, rounded once).
#pragma once

#include <chrono>
#include <cstdint>

#include <epmoe/dtype.h>

#include "comm/algorithm.h"
#include "comm/collective_handle.h"
#include "transport/communicator.h"

namespace epmoe::comm {

struct AllReduceOptions {
  void* data = nullptr;  // num_elements elements, summed in place
  std::int64_t num_elements = 0;
  DType dtype = DType::f32;  // f32 or bf16 (native: f32)
  Algorithm algorithm = Algorithm::ring;
  std::uint32_t tag = 0;
  std::chrono::milliseconds timeout = kDefaultTimeout;

  void validate(const transport::Communicator& comm) const;  // throws ConfigError
};

CollectiveHandle all_reduce(transport::Communicator& comm, const AllReduceOptions& options);

}  // namespace epmoe::comm
