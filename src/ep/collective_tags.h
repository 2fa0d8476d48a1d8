// Collective tags of a dispatcher: tag_base (one per layer, a multiple of
// 1024) + chunk * 16 + operation, so every collective in flight at once has
// its own tag (comm/tag.h adds the slot bits below these).
#pragma once

#include <cstdint>

namespace epmoe::ep {

enum class EpOp : std::uint32_t {
  forward_scale = 0,       // fp8_tensor: the global absmax
  forward_tokens = 1,
  forward_metadata = 2,    // routing: ids + weights (ring) or entries (alltoall)
  forward_combine = 3,
  backward_cotangent = 4,
  backward_dx = 5,
  backward_dweights = 6,
  remat_tokens = 7,        // x_sorted recomputed: the dispatch again
  remat_metadata = 8,
};

constexpr std::uint32_t ep_tag(std::uint32_t tag_base, int chunk, EpOp op) {
  return tag_base + static_cast<std::uint32_t>(chunk) * 16 + static_cast<std::uint32_t>(op);
}

}  // namespace epmoe::ep
