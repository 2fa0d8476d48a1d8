// RingDispatcher: ring of experts (DESIGN.md §4.6). Per chunk, every rank
// all-gathers the chunk's tokens and their routing (ids + weights) over the
// EP group with the bidirectional ring, computes the rows routed to its own
// experts, and reduce-scatters the weighted partial outputs back to the
// tokens' owners: a chunk's slots are the R * chunk_tokens gathered tokens.
//
// Backward: the output cotangent dy is all-gathered (started a chunk ahead
// and overlapped with the experts' backward, or with
// cotangent_all_gather=plain issued blocking where it is needed — the same
// bits), and dx and the routing-weight gradients are reduce-scattered home.
// Each (token, k) weight gradient is computed on exactly one rank and is zero
// on the others, so its reduce-scatter sum is exact.
//
// Ranks may hold different numbers of tokens (N = 7 over 2 ranks: 4 and 3).
// start_forward all-gathers every rank's token count (one int64 each, a
// blocking collective of a few microseconds), and chunk c's slots are then
// rank 0's chunk-c tokens, then rank 1's, ... - the all-gathers and
// reduce-scatters move blocks of unequal size (comm/all_gather.h).
//
// Per rank and chunk of n tokens it receives ·n·row_bytes of tokens,
// against ≈ K·n·row_bytes·(R-1)/R for the all-to-all: the ring wins when R < K.
//
// Dynamic replicas (ep/replica_exchange.h): every rank already sees every
// token, so a replica costs no token traffic, only its weights. A rank keeps
// a gathered pair (r, t, k) of expert e when the plan's copy for its global
// position is on this rank; the position is counted per (source rank,
// expert) across the chunks in order (rank r's tokens arrive in token order,
// chunk after chunk), and each chunk remembers where its counts started so a
// recomputed dispatch (remat) keeps the same rows.
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

class RingDispatcher final : public Dispatcher {
 public:
  RingDispatcher(transport::Communicator& comm, EpConfig config);
  ~RingDispatcher() override;

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
  void start_gather(int chunk, bool remat);
  ExpertRows collect_rows(int chunk);
  void start_cotangent_gather(int chunk);

  transport::Communicator& comm_;  // not owned
  EpConfig config_;
  int num_local_experts_;
  TokenCodec codec_;
  TensorScales tensor_scales_;  // fp8_tokens=tensor: this step's chunk scales
  TensorView x_;                // the caller's, from start_forward to the end of the step
  TensorView dy_;               // the caller's, from start_backward
  RoutingView routing_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::vector<std::int64_t> tokens_by_rank_;  // [R] this step's token count of every rank
  DispatchStats stats_;
  // Dynamic replicas (null when off). Pairs seen so far this step per
  // (source rank, expert), [R * E]: the ring rank's running positions.
  std::unique_ptr<ReplicaExchange> replicas_;
  std::vector<std::int64_t> pairs_seen_;
};

}  // namespace epmoe::ep
