// AllToAllDispatcher (DESIGN.md §4.5): ragged all-to-all of token rows.
//
// Forward, per chunk: every (token, k) pair goes to the rank of its
// destination (ep/step_state.h: a home expert, or a replica slot the layer
// chose). Counts travel first (inside comm::all_to_all_v), so buffers are
// sized exactly and no pair is ever dropped, unless capacity_factor > 0
// caps each expert at ceil(capacity_factor * chunk_tokens * K / E) pairs per
// source rank: pairs beyond it (later tokens first) are counted in the
// step's dropped_pairs, contribute exactly zero to y and get a zero weight
// gradient. With dedup, a token travels once to each rank that computes any
// of its pairs, with its (local expert, weight) list; the receiver expands
// it to one row per expert and returns one row per (token, rank): the
// weighted sum of its local experts' outputs.
//
// Wire format of one destination's message, one all_to_all_v per chunk:
// routing metadata as 32-bit words, per row [n, (local expert, weight
// bits) x n], then the token rows (TokenCodec). The combine returns one row
// per received row; the backward sends dy rows the forward way and returns
// dx rows and one f32 weight gradient per entry the reverse way, with the
// counts the forward learnt (no count round). Combine, dy and dx rows travel
// as wire_dtype (f32, or bf16 rounded once and summed in f32 at home).
#pragma once

#include <memory>
#include <vector>

#include "ep/dispatcher.h"
#include "transport/communicator.h"

namespace epmoe::ep {

class AllToAllDispatcher final : public Dispatcher {
 public:
  AllToAllDispatcher(transport::Communicator& comm, const EpConfig& config);
  ~AllToAllDispatcher() override;

 private:
  struct Step;
  struct Buffers;
  std::unique_ptr<StepState> make_step_state() const override;
  std::unique_ptr<PhaseBuffers> make_phase_buffers() const override;
  void begin_step(StepState& step, const RoutingView& routing) override;
  void start_dispatch(StepState& step, int chunk, bool remat) override;
  ExpertRows collect_rows(StepState& step, int chunk, bool remat) override;
  void start_combine(StepState& step, int chunk, Tensor slot_outputs) override;
  void finish_combine(StepState& step, int chunk, float* y) override;
  void start_cotangents(StepState& step, int chunk) override;
  Tensor collect_cotangents(StepState& step, int chunk) override;
  void start_gradients(StepState& step, int chunk, Tensor slot_dx, std::vector<float> row_dweights) override;
  void finish_gradients(StepState& step, int chunk, float* dx, float* d_topk_weights) override;

  void plan_chunk(Step& step, Buffers& buffers, const RoutingView& routing, int chunk);
  void send_tokens(Step& step, int chunk, bool remat);
};

}  // namespace epmoe::ep
