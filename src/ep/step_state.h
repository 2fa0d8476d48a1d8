// What one expert-parallel step is made of, apart from the dispatcher that
// moves it (ep/dispatcher.h):
//  * RoutingView: the caller's routing decisions for the step's tokens;
//  * StepState: what the step owns from its dispatch to the end of its
//    backward - the caller's views, its tags, its statistics and the
//    dispatcher's per-chunk layout (the concrete dispatchers derive from
//    it: counts to and from each rank, row -> token and entry -> row maps,
//    slot offsets, fp8 scales, the collectives in flight). A DispatchHandle
//    owns one; the dispatcher's pool keeps it between steps so its vectors
//    keep their capacity (no fresh page in a steady step).
//  * PhaseBuffers: the exchange buffers one phase (a forward, or a
//    backward) moves its bytes through - token messages, combine and
//    gradient rows. Nothing in them outlives the phase, so one set serves
//    every layer in turn: the dispatcher lends a set at the phase's start and
//    takes it back at its finish, and holds as many as were ever lent at once.
#pragma once

#include <cstdint>
#include <vector>

#include <epmoe/step_stats.h>

#include "core/tensor.h"
#include "ep/expert_rows.h"
#include "ep/token_codec.h"

namespace epmoe::ep {

// This rank's routing for one step: per local token, K destinations and K
// combine weights. A destination is a physical expert: rank *
// experts_per_rank + local index, where local indices [0, E_l) are the
// rank's home experts and E_l + b its replica slot b (with replicas; the
// layer maps logical experts to copies, ep/replica_exchange.h). Without
// replicas a destination is the expert id itself.
struct RoutingView {
  const std::int32_t* destinations = nullptr;  // [num_tokens, top_k]
  const float* topk_weights = nullptr;         // [num_tokens, top_k]
  std::int64_t num_tokens = 0;
  int top_k = 0;
};

// What one step's dispatch measured: public (<epmoe/step_stats.h>).
using epmoe::DispatchStats;
void reset_stats(DispatchStats& stats, int num_local_experts);
// Adds a chunk's rows of the home experts' groups (the first
// num_local_experts); a replica slot's are the exchange's.
void count_rows(DispatchStats& stats, const ExpertRows& rows, int num_local_experts);

class PhaseBuffers {
 public:
  virtual ~PhaseBuffers() = default;
  // Bytes the set keeps (the capacity of its vectors).
  virtual std::int64_t capacity_bytes() const = 0;

  // The pool's bookkeeping (ep/dispatcher.cc).
  bool in_use = false;
  std::int64_t counted_bytes = 0;
};

class StepState {
 public:
  virtual ~StepState() = default;
  // Bytes the layout keeps across steps (the capacity of its vectors).
  virtual std::int64_t capacity_bytes() const = 0;

  TensorView x;   // the caller's [N_l, H], from the dispatch to the end of the step
  TensorView dy;  // the caller's [N_l, H], from start_backward
  std::int64_t num_tokens = 0;
  int top_k = 0;
  int num_chunks = 1;
  std::uint32_t tag_base = 0;       // the step's block of tags (ep/collective_tags.h)
  DispatchStats stats;              // reset at the dispatch
  TensorScales tensor_scales;       // fp8_tokens=tensor: the step's chunk scales (Dispatcher::start_tensor_scales)
  PhaseBuffers* buffers = nullptr;  // the running phase's, lent by the dispatcher; null between phases
  std::int64_t counted_bytes = 0;   // the pool's bookkeeping (ep/dispatcher.cc)
};

}  // namespace epmoe::ep
