// barrier: returns on a rank once every rank has entered it. Dissemination
// barrier: ceil(log2 R) rounds of empty messages, round k to rank + 2^k and
// from rank - 2^k.
#pragma once

#include <chrono>
#include <cstdint>

#include "comm/algorithm.h"
#include "comm/collective_handle.h"
#include "transport/communicator.h"

namespace epmoe::comm {

struct BarrierOptions {
  Algorithm algorithm = Algorithm::ring;  // ring = our dissemination barrier
  std::uint32_t tag = 0;
  std::chrono::milliseconds timeout = kDefaultTimeout;

  void validate(const transport::Communicator& comm) const;  // throws ConfigError
};

CollectiveHandle barrier(transport::Communicator& comm, const BarrierOptions& options = {});

}  // namespace epmoe::comm
