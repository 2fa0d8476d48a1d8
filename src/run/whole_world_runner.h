// WholeWorldRunner: one MoE layer, forward (and backward with dy), across the
// R ranks of an ExpertParallelSettings inside this process, run after run:
// what `epmoe layer` runs once and the public WholeWorldLayer
// (<epmoe/whole_world_layer.h>) and Python's epmoe.WholeWorldLayer run per call. A
// harness on the per-rank API (run/layer_rank.h), not a separate engine.
//
// Kept between runs: R rank threads (transport/threads/rank_threads.h) and,
// per rank, its EP group, layer and buffers, built at the first run and again
// only when the arrays' shape changes, or after a failed run (which aborts
// the world: the next run starts a fresh one under the same threads).
// Settings with single_rank_local() run on the calling thread, with no
// thread and no communication.
//
// Outputs: written in place into the caller's full arrays (LayerOutputs, the
// shapes of a single-rank run), each rank its own rows and experts, dgate
// summed from the ranks' parts in rank order: nothing is gathered or copied
// through another buffer.
#pragma once

#include <memory>
#include <vector>

#include <epmoe/whole_world_layer.h>

#include "run/expert_parallel_settings.h"
#include "run/layer_inputs.h"
#include "run/layer_rank.h"
#include "run/rank_report.h"

namespace epmoe::transport::threads {
class RankThreads;
}

namespace epmoe::run {

class WholeWorldRunner {
 public:
  // settings.transport must be threads (transport=mpi runs one rank per
  // process: run/expert_parallel_run.h).
  explicit WholeWorldRunner(const ExpertParallelSettings& settings);
  ~WholeWorldRunner();
  WholeWorldRunner(const WholeWorldRunner&) = delete;
  WholeWorldRunner& operator=(const WholeWorldRunner&) = delete;

  const ExpertParallelSettings& settings() const { return settings_; }

  // `config` must be built for inputs' dimensions; `out` holds the full
  // outputs' views (the gradients' only when inputs.dy is given). Returns
  // every rank's report, in rank order. A rank's error is rethrown here after
  // every rank has ended.
  std::vector<RankReport> run(const LayerInputs& inputs, const MoeLayerConfig& config, const LayerOutputs& out);

 private:
  // Per rank: rebuilds the rank's group and layer when `config` is not the
  // one they were built for (every rank decides alike: the flag is set
  // between runs).
  void prepare_rank(LayerRank& rank, transport::Communicator* comm, const MoeLayerConfig& config);

  ExpertParallelSettings settings_;
  std::unique_ptr<transport::threads::RankThreads> threads_;  // null for single_rank_local()
  std::vector<LayerRank> ranks_;                              // [R]
  std::optional<MoeLayerConfig> built_for_;                   // what ranks_ were built for; null: rebuild
};

}  // namespace epmoe::run
