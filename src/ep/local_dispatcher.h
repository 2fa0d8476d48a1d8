// LocalDispatcher: one rank holds every expert (R = 1, or no expert
// parallelism). No communication: a chunk's slots are its tokens, and the
// step's "exchanges" are copies.
#pragma once

#include <memory>
#include <vector>

#include "ep/dispatcher.h"

namespace epmoe::ep {

class LocalDispatcher final : public Dispatcher {
 public:
  // config.num_experts, top_k, hidden and num_chunks; the rest is unused.
  explicit LocalDispatcher(const EpConfig& config);
  ~LocalDispatcher() override;

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
};

}  // namespace epmoe::ep
