// ring_all_gather: every rank contributes num_elements_per_rank elements (or,
// for blocks of unequal size, num_elements_by_rank[rank]); every rank ends
// with all contributions concatenated in rank order, bit-equal to a naive
// gather.
//
// Unequal blocks (a ring of experts whose ranks hold 3 and 5 tokens): every
// rank passes the same num_elements_by_rank, block r starts at the sum of the
// counts before it. Counts may be 0. The ring is the same: each block's
// halves travel both ways; a link carries whatever block is due at the step.
//
// Bidirectional (the default, DESIGN.md §4.4): each rank's chunk is split in
// two lanes, the first ceil(n/2) elements travel clockwise (to rank+1), the
// rest counter-clockwise (to rank-1); at step s (0..R-2) a lane forwards the
// block it received at step s-1, so each half crosses R-1 links and both
// directions of every full-duplex link carry C/2 per step: time ≈
// ·C / (2·link bandwidth) against ·C / bandwidth one way. An odd
// count is split unevenly by one element; a chunk of one element cannot be
// halved and travels clockwise only. `pipe` > 1 cuts each lane's piece into
// that many messages so forwarding starts before a whole half has arrived.
//
// Example, R=4 bidirectional, rank 1, chunks A B C D of ranks 0..3 split
// into halves a0|a1 ...:  step 0 sends b0 -> 2, b1 -> 0; receives a0 from 0,
// c1 from 2.  step 1 forwards a0 -> 2, c1 -> 0; receives d0 from 0, d1 from 2.
// step 2 forwards d0 -> 2, d1 -> 0; receives c0 from 0, a1 from 2.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include <epmoe/dtype.h>

#include "comm/algorithm.h"
#include "comm/collective_handle.h"
#include "transport/communicator.h"

namespace epmoe::comm {

struct AllGatherOptions {
  const void* input = nullptr;             // this rank's block; may be output's own slot
  void* output = nullptr;                  // every rank's block, rank order
  std::int64_t num_elements_per_rank = 0;  // equal blocks: every rank's count
  // Unequal blocks: [size()] counts, the same on every rank; then
  // num_elements_per_rank must be 0. Empty: equal blocks.
  std::vector<std::int64_t> num_elements_by_rank = {};
  DType dtype = DType::f32;  // only its size matters: any dtype moves as bytes
  RingDirection direction = RingDirection::bidirectional;
  std::int64_t pipe = 1;  // messages per lane per step, >= 1
  Algorithm algorithm = Algorithm::ring;
  std::uint32_t tag = 0;  // comm/tag.h
  std::chrono::milliseconds timeout = kDefaultTimeout;

  void validate(const transport::Communicator& comm) const;  // throws ConfigError
  // Element count of rank r's block, for either form.
  std::int64_t block_elements(int rank) const;
  std::int64_t total_elements(int num_ranks) const;
};

// Starts the all-gather and returns at once; output is complete after wait().
CollectiveHandle ring_all_gather(transport::Communicator& comm, const AllGatherOptions& options);

}  // namespace epmoe::comm
