// all_to_all_v: rank r sends send_counts[p] elements to every rank p (its
// input holds them packed in rank order) and receives what every rank sends
// it, packed in rank order. Counts first: the R send counts are exchanged, so
// receive buffers are sized exactly (no token is ever dropped, DESIGN.md
// §4.5); then the payload moves pairwise - at step k rank r sends to r+k and
// receives from r-k, all steps posted at once.
//
// The output vector is resized to the received total (its capacity is reused
// from call to call: keep one per step buffer to avoid first-touch costs).
//
// Known receive counts (as gloo's AlltoallvOptions takes them): a caller that
// already knows what every rank sends it - the combine and the backward of an
// exchange whose forward it saw - passes known_recv_counts, and the count
// round is skipped (one message per pair instead of two). The receive buffer
// may then be the caller's own (recv_buffer, sized by the caller: no
// allocation inside the collective). A peer that sends another size than
// announced fails the collective with a PeerError naming the peer (the
// transports check every message's size).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <epmoe/dtype.h>

#include "comm/algorithm.h"
#include "comm/collective_handle.h"
#include "transport/communicator.h"

namespace epmoe::comm {

struct AllToAllVOptions {
  const void* input = nullptr;            // sum(send_counts) elements, packed by destination
  std::vector<std::int64_t> send_counts;  // [size()] elements to each rank, 0 allowed
  DType dtype = DType::f32;               // only its size matters
  // Filled by the collective; must stay valid until it completes.
  std::vector<std::byte>* output = nullptr;          // resized to sum(recv_counts) elements
  std::vector<std::int64_t>* recv_counts = nullptr;  // resized to size(); optional with known_recv_counts
  // Known receive counts [size()] (elements from each rank; entry rank() must
  // equal send_counts[rank()]): no count round. Must stay valid until the
  // collective completes.
  const std::vector<std::int64_t>* known_recv_counts = nullptr;
  // With known_recv_counts: the caller's receive buffer, sum(known) elements,
  // used instead of `output` (which may then be null).
  void* recv_buffer = nullptr;
  Algorithm algorithm = Algorithm::ring;  // ring = our pairwise exchange
  std::uint32_t tag = 0;
  std::chrono::milliseconds timeout = kDefaultTimeout;

  void validate(const transport::Communicator& comm) const;  // throws ConfigError
};

CollectiveHandle all_to_all_v(transport::Communicator& comm, const AllToAllVOptions& options);

}  // namespace epmoe::comm
