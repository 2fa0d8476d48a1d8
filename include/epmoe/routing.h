// What a router decided for one step of a layer (src/moe/router.h computes
// it; <epmoe/moe_layer.h> hands it out for a load-balance loss).
//
// Public and std-only.
#pragma once

#include <epmoe/tensor.h>

namespace epmoe {

struct RouterOutput {
  Tensor logits;        // [N, E] f32, pre-activation scores
  Tensor topk_ids;      // [N, K] i32
  Tensor topk_weights;  // [N, K] f32
};

}  // namespace epmoe
