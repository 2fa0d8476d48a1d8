// broadcast: the root's num_elements elements end up on every rank. Binomial
// tree (ceil(log2 R) rounds; relative rank v receives from v minus its lowest
// set bit and sends to v + 2^j for the smaller powers), the whole buffer per
// message: broadcasts here carry small things (configs, replica plans).
#pragma once

#include <chrono>
#include <cstdint>

#include <epmoe/dtype.h>

#include "comm/algorithm.h"
#include "comm/collective_handle.h"
#include "transport/communicator.h"

namespace epmoe::comm {

struct BroadcastOptions {
  void* data = nullptr;  // input on the root, output elsewhere
  std::int64_t num_elements = 0;
  DType dtype = DType::f32;  // only its size matters
  int root = 0;
  Algorithm algorithm = Algorithm::ring;  // ring = our binomial tree
  std::uint32_t tag = 0;
  std::chrono::milliseconds timeout = kDefaultTimeout;

  void validate(const transport::Communicator& comm) const;  // throws ConfigError
};

CollectiveHandle broadcast(transport::Communicator& comm, const BroadcastOptions& options);

}  // namespace epmoe::comm
