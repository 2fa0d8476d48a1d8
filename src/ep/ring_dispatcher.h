// RingDispatcher: ring of experts (DESIGN.md §4.6). Per chunk, every rank
// all-gathers the chunk's tokens and their routing (destinations + weights)
// over the EP group with the bidirectional ring, computes the rows routed to
// its own experts, and reduce-scatters the weighted partial outputs back to
// the tokens' owners: a chunk's slots are the R * chunk_tokens gathered tokens.
//
// Backward: the output cotangent dy is all-gathered (started a chunk ahead
// and overlapped with the experts' backward, or with
// cotangent_all_gather=plain issued blocking where it is needed - the same
// bits), and dx and the routing-weight gradients are reduce-scattered home.
// Each (token, k) weight gradient is computed on exactly one rank and is zero
// on the others, so its reduce-scatter sum is exact.
//
// Ranks may hold different numbers of tokens (N = 7 over 2 ranks: 4 and 3).
// The step starts by exchanging every rank's token count (one int64 each,
// one message per peer, overlapped with the first chunk's own work; see
// begin_step), and chunk c's slots are then
// rank 0's chunk-c tokens, then rank 1's, ... - the all-gathers and
// reduce-scatters move blocks of unequal size (comm/all_gather.h).
//
// Combine outputs, dy and dx travel as wire_dtype: f32, or bf16 (dy rounded
// once by its owner; a reduce-scatter's partial sums rounded once per link,
// summed in f32 at every rank: comm/reduce_scatter.h).
//
// Per rank and chunk of n tokens it receives ·n·row_bytes of tokens,
// against ≈ K·n·row_bytes·(R-1)/R for the all-to-all: the ring wins when R < K.
//
// Replicas: every rank already sees every token, so a replica costs no token
// traffic, only its weights. The sender's routing words carry each pair's
// destination (ep/step_state.h), chosen by the layer, so a receiver keeps
// exactly the pairs whose destination is on it, in every chunk and in a
// remat re-gather alike.
#pragma once

#include <memory>
#include <vector>

#include "ep/dispatcher.h"
#include "transport/communicator.h"

namespace epmoe::ep {

class RingDispatcher final : public Dispatcher {
 public:
  RingDispatcher(transport::Communicator& comm, const EpConfig& config);
  ~RingDispatcher() override;

 private:
  struct Step;
  struct Buffers;
  std::unique_ptr<StepState> make_step_state() const override;
  std::unique_ptr<PhaseBuffers> make_phase_buffers() const override;
  void begin_step(StepState& step, const RoutingView& routing) override;
  void plan_chunks(Step& step) const;
  void start_dispatch(StepState& step, int chunk, bool remat) override;
  ExpertRows collect_rows(StepState& step, int chunk, bool remat) override;
  void start_combine(StepState& step, int chunk, Tensor slot_outputs) override;
  void finish_combine(StepState& step, int chunk, float* y) override;
  void start_cotangents(StepState& step, int chunk) override;
  Tensor collect_cotangents(StepState& step, int chunk) override;
  void start_gradients(StepState& step, int chunk, Tensor slot_dx, std::vector<float> row_dweights) override;
  void finish_gradients(StepState& step, int chunk, float* dx, float* d_topk_weights) override;
};

}  // namespace epmoe::ep
