// Collective tags of one expert-parallel step: the step's tag_base (its
// block of 1024 in the group's range, ep/dispatcher.h) + chunk * 16 +
// operation, so every collective in flight at once has its own tag, in every
// step in flight (comm/tag.h adds the slot bits below these).
#pragma once

#include <cstdint>

namespace epmoe::ep {

enum class EpOp : std::uint32_t {
  forward_scale = 0,  // fp8_tensor: the global absmax
  forward_tokens = 1,
  // Chunks 0 and 1: replica_costs=measured's probe messages, small and
  // weight-sized (point-to-point); chunk 2: the all-gather of each rank's
  // measured rates (ep/replica_rate_probe.h). (2 was free: the routing words
  // travel inside forward_tokens' messages.)
  replica_rate_probe = 2,
  forward_combine = 3,
  backward_cotangent = 4,
  backward_dx = 5,
  backward_dweights = 6,
  remat_tokens = 7,  // x_sorted recomputed: the dispatch again
  // 8: free (as 2)
  // Dynamic replicas (ep/replica_exchange.h). Point-to-point messages: the
  // chunk field carries the redundant slot index b (< 64), so each (layer,
  // slot, tensor) has its own tag.
  replica_wi0 = 9,
  replica_wi1 = 10,
  replica_wo = 11,
  replica_dwi0 = 12,
  replica_dwi1 = 13,
  replica_dwo = 14,
  replica_counts = 15,     // chunk 0: the all-gather of [R, E] counts
  ring_token_counts = 15,  // chunk 1 (chunk 0 is replica_counts): the ring's per-rank token counts
};

constexpr std::uint32_t ep_tag(std::uint32_t tag_base, int chunk, EpOp op) {
  return tag_base + static_cast<std::uint32_t>(chunk) * 16 + static_cast<std::uint32_t>(op);
}

}  // namespace epmoe::ep
