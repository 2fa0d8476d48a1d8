// LocalDispatcher: one rank holds every expert (R = 1, or no expert
// parallelism). No communication: a chunk's slots are its tokens.
#pragma once

#include "ep/dispatcher.h"

namespace epmoe::ep {

class LocalDispatcher final : public Dispatcher {
 public:
  LocalDispatcher(int num_experts, int num_chunks);

  int num_chunks() const override { return num_chunks_; }
  int num_local_experts() const override { return num_experts_; }
  int first_local_expert() const override { return 0; }

  const DispatchStats& stats() const override { return stats_; }

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

  int num_experts_;
  int num_chunks_;
  TensorView x_;   // the caller's, from start_forward to the end of the step
  TensorView dy_;  // the caller's, from start_backward
  RoutingView routing_;
  Tensor y_;
  DispatchGradients grads_;
  // Per chunk: the (token, k) pair index of each expert row.
  std::vector<std::vector<std::int64_t>> pair_of_row_;
  DispatchStats stats_;
};

}  // namespace epmoe::ep
