// reduce_scatter: input holds size() blocks in rank order, block r of
// num_elements_per_rank[r] elements; rank r receives the element-wise sum of
// every rank's block r. Ring algorithm, bidirectional by default like the
// all-gather (the first ceil(n/2) elements of each block are reduced going
// clockwise, the rest counter-clockwise), with a fixed summation order
// (comm/ring.h): element i of block b is summed starting with rank b+1's
// contribution (b-1's on the counter-clockwise half) and ending with rank
// b's own, so results are identical run to run, and independent of timing and
// thread counts. dtype f32 or bf16. Partial sums travel as
// wire_dtype: f32 by default (for bf16 input too: twice its bytes, so each
// result is rounded once, as the fp32-accumulation contract of DESIGN.md §3
// asks), or bf16 (half the bytes of f32: what the accelerators' systems send
// when they compute in bf16). Either way every sum is taken in f32 and the
// output is `dtype`; with a bf16 wire each partial sum is rounded once per
// link it crosses, R-1 roundings in all (docs/NUMERICS.md derives the bound).
//
// Built on point-to-point messages only - never on MPI_Reduce_scatter(_block),
// which runs at ~0.1 GB/s on this machine (DESIGN.md §7). algorithm=native is
// there to show that comparison (f32 only).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include <epmoe/dtype.h>

#include "comm/algorithm.h"
#include "comm/collective_handle.h"
#include "transport/communicator.h"

namespace epmoe::comm {

struct ReduceScatterOptions {
  const void* input = nullptr;                      // sum(num_elements_per_rank) elements
  void* output = nullptr;                           // num_elements_per_rank[rank] elements
  std::vector<std::int64_t> num_elements_per_rank;  // [size()], counts may differ, 0 allowed
  DType dtype = DType::f32;                         // f32 or bf16
  DType wire_dtype = DType::f32;                    // partial sums on the links: f32 or bf16
  RingDirection direction = RingDirection::bidirectional;
  Algorithm algorithm = Algorithm::ring;
  std::uint32_t tag = 0;
  std::chrono::milliseconds timeout = kDefaultTimeout;

  void validate(const transport::Communicator& comm) const;  // throws ConfigError
};

CollectiveHandle reduce_scatter(transport::Communicator& comm, const ReduceScatterOptions& options);

}  // namespace epmoe::comm
