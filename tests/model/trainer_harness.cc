#include "trainer_harness.h"

#include <algorithm>
#include <cmath>
#include <mutex>

#include "core/error.h"
#include "transport/threads/launcher.h"

namespace epmoe::testing {

MoeLmConfig small_model() {
  MoeLmConfig model;
  model.vocab_size = 64;
  model.num_layers = 2;
  model.layer.hidden = 32;
  model.layer.ffn = 32;
  model.layer.router.num_experts = 8;
  model.layer.router.top_k = 2;
  model.init_seed = 5;
  return model;
}

TrainerConfig small_trainer() {
  TrainerConfig trainer;
  trainer.steps = 20;
  trainer.batch_size = 8;
  trainer.data.vocab_size = 64;
  trainer.data.seq_len = 16;
  trainer.data.distribution = TokenDistribution::zipf;
  trainer.data.repeat_probability = 0.5;
  trainer.data.seed = 11;
  trainer.learning_rate.peak = 3e-3;
  trainer.learning_rate.warmup_steps = 5;
  trainer.learning_rate.total_steps = trainer.steps;
  return trainer;
}

TrainSetup small_setup(int ranks) {
  TrainSetup setup;
  setup.ranks = ranks;
  setup.model = small_model();
  setup.trainer = small_trainer();
  return setup;
}

std::vector<double> train_losses(const TrainSetup& setup) {
  EpConfig ep = setup.ep;
  ep.num_experts = setup.model.layer.router.num_experts;
  ep.top_k = setup.model.layer.router.top_k;
  ep.hidden = setup.model.layer.hidden;
  ep.validate(setup.ranks);
  std::vector<double> losses;
  std::mutex mutex;
  transport::threads::run_ranks(setup.ranks, {.compute_threads_per_rank = 1}, [&](transport::Communicator& comm) {
    const FaultScope faults(setup.faults);
    EpConfig group_config = ep;
    group_config.dispatch = setup.dispatch;
    group_config.tag_base = 1024;  // above the trainer's [0, 1024)
    EpGroup group(comm, group_config);
    TrainSummary summary = train(comm, group, setup.trainer, setup.model, setup.observer);
    if (comm.rank() == 0) {
      std::lock_guard lock(mutex);
      losses = summary.losses;
    }
  });
  return losses;
}

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  EPMOE_CHECK_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

}  // namespace epmoe::testing
