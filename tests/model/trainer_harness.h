// Runs model/trainer.h's train() over R rank threads on a small model, for
// the trainer's parity and checkpoint tests.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/fault_injection.h"
#include "ep/ep_config.h"
#include "model/moe_lm.h"
#include "model/trainer.h"

namespace epmoe::testing {

struct TrainSetup {
  int ranks = 1;
  DispatchKind dispatch = DispatchKind::alltoall;
  EpConfig ep;                      // num_experts, top_k, hidden filled from the model
  MoeLmConfig model;                // small_model() by default
  TrainerConfig trainer;            // small_trainer() by default
  FaultInjector* faults = nullptr;  // the run's fault injection, in scope on every rank (nullptr: none)
  TrainObserver observer;           // called on rank 0
};

MoeLmConfig small_model();      // V=64 H=32 F=32 E=8 K=2 L=2
TrainerConfig small_trainer();  // 20 steps, batch 8 x 16 tokens, zipf data
TrainSetup small_setup(int ranks);

// Every step's loss (identical on every rank; rank 0's returned).
std::vector<double> train_losses(const TrainSetup& setup);

// max_s |a_s - b_s| / |b_s|
double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace epmoe::testing
