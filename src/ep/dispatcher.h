// Dispatcher: moves tokens from the rank that holds them to the ranks whose
// experts they are routed to, and the experts' outputs back (DESIGN.md §4.5,
// §4.6). MoeLayer drives it; the expert math stays in moe/.
//
// A step is split into num_chunks() chunks of this rank's tokens (chunk c
// covers local tokens [c * N_l / n, (c + 1) * N_l / n)), so that a
// dispatcher can move chunk c + 1 while the experts compute chunk c.
// dispatch() starts a step and returns its handle (ep/dispatch_handle.h),
// through which the step's chunks, combine and backward go in their order.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/memory_ledger.h"
#include "core/tensor.h"
#include "core/timer.h"
#include "ep/dispatch_handle.h"
#include "ep/expert_rows.h"

namespace epmoe::ep {

class ReplicaExchange;

// This rank's routing decisions: for each local token, K expert ids (global)
// and K weights.
struct RoutingView {
  const std::int32_t* topk_ids = nullptr;  // [num_tokens, top_k]
  const float* topk_weights = nullptr;     // [num_tokens, top_k]
  std::int64_t num_tokens = 0;
  int top_k = 0;
};

struct DispatchGradients {
  Tensor dx;              // [N_l, H] through the experts
  Tensor d_topk_weights;  // [N_l, K]
};

// What a dispatcher measured over the last forward + backward.
struct DispatchStats {
  // Bytes this rank sent, by collective ("forward/all_to_all_v tokens", ...;
  // "backward/remat ..." is what recomputing x_sorted costs). Every byte
  // sent is under some kind, the small control streams too: the count round
  // ("forward/all_to_all_v counts"), the ring's token counts, the fp8_tensor
  // scales and the replica planner's counts ("forward/ring_all_gather
  // token counts", "... fp8 scale", "... replica counts"). Dynamic
  // replicas' weights and gradients are here too ("forward/replica weights",
  // "backward/replica gradients"); their other statistics are the exchange's
  // (ep/replica_stats.h).
  std::map<std::string, std::int64_t> bytes_sent;
  // Rows this rank's experts computed, per local expert (all chunks).
  std::vector<std::int64_t> rows_per_local_expert;
  // (token, expert) pairs this rank's tokens lost to a capacity limit.
  std::int64_t dropped_pairs = 0;
  PhaseTimes phase_seconds;  // dispatch, combine, backward_* (waits included)

  void reset(int num_local_experts);
  // Adds a chunk's rows of the home experts' groups; a replica slot's
  // (E_l + b) are the exchange's (ReplicaExchange::count_slot_rows).
  void count_rows(const ExpertRows& rows, int num_local_experts);
};

class Dispatcher {
 public:
  virtual ~Dispatcher() = default;

  virtual int num_chunks() const = 0;
  virtual int num_local_experts() const = 0;
  virtual int first_local_expert() const = 0;

  // Starts a step: plans chunk 0 and puts its tokens in flight. UsageError
  // while another step's handle is in flight.
  DispatchHandle dispatch(TensorView x, const RoutingView& routing);

  virtual const DispatchStats& stats() const = 0;

  // Dynamic replicas: non-null when balance=dynamic with redundant slots.
  // Then the rows' local expert index runs over E_l home experts followed by
  // the B redundant slots (index E_l + b is slot b), and the layer computes
  // on E_l + B experts' weights (ep/replica_exchange.h). The exchange's
  // statistics are its own: replicas()->stats().
  virtual ReplicaExchange* replicas() { return nullptr; }
  virtual int num_compute_experts() const { return num_local_experts(); }  // E_l (+ B)

  // The buffers this dispatcher keeps across steps (at their high-water
  // mark: exchanged rows, routing words, combine and gradient rows, and the
  // replica slots' weights and gradients) are charged to `ledger` (not
  // owned; null: none) under "buffer/dispatch" and "buffer/replica slots",
  // updated as they grow, after finish_forward and after finish_backward
  // (no exchange in flight then). MoeLayer passes its ledger; the "saved"
  // group of that ledger stays the activations alone.
  void charge_buffers_to(MemoryLedger* ledger);

 protected:
  // The step's work, called only by the handle, in its order.
  friend class DispatchHandle;
  virtual void start_forward(TensorView x, const RoutingView& routing) = 0;
  virtual ExpertRows receive_rows(int chunk) = 0;
  virtual void send_outputs(int chunk, Tensor slot_outputs) = 0;  // [num_slots, H]
  virtual Tensor finish_forward() = 0;                            // y [N_l, H]
  virtual void start_backward(TensorView dy) = 0;
  virtual ExpertRows redispatch_rows(int chunk) = 0;
  virtual Tensor receive_cotangents(int chunk) = 0;  // [num_slots, H]
  virtual void send_gradients(int chunk, Tensor slot_dx, std::vector<float> row_dweights) = 0;
  virtual DispatchGradients finish_backward() = 0;

  // Bytes of the buffers kept across steps (their capacity), replica slots
  // excluded: those are ReplicaExchange::buffer_bytes().
  virtual std::int64_t persistent_buffer_bytes() const { return 0; }

 private:
  void update_buffer_charges();  // by the handle, after finish_forward and finish_backward

  bool step_in_flight_ = false;  // a handle of this dispatcher is in its step
  LedgerCharge dispatch_buffers_, replica_buffers_;
};

// Local token range of chunk c: [begin, end).
struct ChunkRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};
ChunkRange chunk_range(std::int64_t num_tokens, int num_chunks, int chunk);

}  // namespace epmoe::ep
