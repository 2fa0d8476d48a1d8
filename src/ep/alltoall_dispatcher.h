// AllToAllDispatcher (DESIGN.md §4.5): ragged all-to-all of token rows.
//
// Forward, per chunk: every (token, k) pair goes to the rank homing its
// expert. Counts travel first (inside comm::all_to_all_v), so buffers are
// sized exactly and no pair is ever dropped, unless capacity_factor > 0
// caps each expert at ceil(capacity_factor * chunk_tokens * K / E) pairs per
// source rank: pairs beyond it (later tokens first) are counted in
// stats().dropped_pairs, contribute exactly zero to y and get a zero
// weight gradient. With dedup, a token travels once to each rank that homes
// any of its experts, with its (local expert, weight) list; the receiver
// expands it to one row per expert and returns one row per (token, rank):
// the weighted sum of its local experts' outputs.
//
// With dynamic replicas (balance=dynamic, ep/replica_exchange.h) a pair of a
// replicated expert may go to a replica's rank instead of the home rank: its
// destination and local expert index (E_l + slot there) come from the step's
// replica plan; nothing else changes on the wire.
//
// Wire format of one destination's message, one all_to_all_v per chunk:
// routing metadata as 32-bit words, per row [n, (local expert, weight
// bits) x n], then the token rows (TokenCodec). The combine returns one f32 row per received row; the backward
// sends dy rows the forward way and returns dx rows and one f32 weight
// gradient per entry the reverse way. Gradients always travel in f32.
#pragma once

#include <memory>
#include <vector>

#include "comm/collective_handle.h"
#include "ep/dispatcher.h"
#include "ep/ep_config.h"
#include "ep/replica_exchange.h"
#include "ep/token_codec.h"
#include "transport/communicator.h"

namespace epmoe::ep {

class AllToAllDispatcher final : public Dispatcher {
 public:
  AllToAllDispatcher(transport::Communicator& comm, EpConfig config);
  ~AllToAllDispatcher() override;

  int num_chunks() const override { return config_.num_chunks; }
  int num_local_experts() const override { return num_local_experts_; }
  int first_local_expert() const override { return comm_.rank() * num_local_experts_; }

  const DispatchStats& stats() const override { return stats_; }
  ReplicaExchange* replicas() override { return replicas_.get(); }
  int num_compute_experts() const override { return num_local_experts_ + (replicas_ ? replicas_->num_slots() : 0); }

 private:
  // The step's work (ep/dispatcher.h), reached through the handle.
  void start_forward(TensorView x, const RoutingView& routing) override;
  ExpertRows receive_rows(int chunk) override;
  void send_outputs(int chunk, Tensor slot_outputs) override;
  Tensor finish_forward() override;

  void start_backward(TensorView dy) override;
  ExpertRows redispatch_rows(int chunk) override;
  Tensor receive_cotangents(int chunk) override;
  void send_gradients(int chunk, Tensor slot_dx, std::vector<float> row_dweights) override;
  DispatchGradients finish_backward() override;
  std::int64_t persistent_buffer_bytes() const override;

  struct Chunk;
  void plan_chunk(int chunk);
  void send_tokens(int chunk, bool remat);
  ExpertRows collect_rows(int chunk, bool remat);
  void start_cotangents(int chunk);
  void count_bytes(const char* name, const std::vector<std::int64_t>& counts, std::int64_t element_bytes);

  transport::Communicator& comm_;  // not owned
  EpConfig config_;
  int num_local_experts_;
  TokenCodec codec_;
  TensorScales tensor_scales_;  // fp8_tokens=tensor: this step's chunk scales
  TensorView x_;                // the caller's, from start_forward to the end of the step
  TensorView dy_;               // the caller's, from start_backward
  RoutingView routing_;
  Tensor y_;
  DispatchGradients grads_;
  std::vector<std::unique_ptr<Chunk>> chunks_;  // kept across steps (their buffers too)
  // plan_chunk's per-destination lists, kept so their capacity is reused.
  struct PlanScratch {
    std::vector<std::vector<std::int64_t>> rows_to, entries_to;
    std::vector<std::vector<std::int32_t>> words_to;
    std::vector<std::int64_t> pairs_per_expert;
    std::vector<std::pair<int, std::int64_t>> kept;
    std::vector<std::int64_t> rows_from, entries_from, tokens_at;  // collect_rows: per source
    std::vector<const std::byte*> row_address;                     // collect_rows: per received row
  };
  PlanScratch plan_scratch_;
  DispatchStats stats_;
  // Dynamic replicas (null when off): the step's destination of every pair.
  std::unique_ptr<ReplicaExchange> replicas_;
  std::vector<PairDestination> pair_destination_;  // [N_l * K]
};

}  // namespace epmoe::ep
