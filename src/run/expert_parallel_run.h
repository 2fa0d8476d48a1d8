// `epmoe layer`'s run of one MoE layer forward (and backward when dy is
// given) across the ranks of an ExpertParallelSettings, into outputs of the
// shapes of a single-rank run, so that the outputs of ranks=R compare
// directly with ranks=1 (run/layer_rank.h says which rows each rank writes):
//  * transport=threads (and one rank): a WholeWorldRunner
//    (run/whole_world_runner.h), every rank writing its rows of the outputs
//    in place;
//  * transport=mpi: this process is one rank (run_rank() holds MPI_Init /
//    MPI_Finalize; a rank's exception prints "rank r failed: ..." and aborts
//    the job); each rank computes into its own rows' buffers, and rank 0
//    alone receives the others' rows (point to point, with the sizes every
//    rank knows) and the reports. No rank but rank 0 ever holds the full
//    outputs.
#pragma once

#include <optional>
#include <vector>

#include <epmoe/moe_layer.h>
#include <epmoe/whole_world_layer.h>

#include "core/tensor.h"
#include "run/expert_parallel_settings.h"
#include "run/layer_inputs.h"
#include "run/rank_report.h"

namespace epmoe::run {

// The full outputs of a run, owned (the gradients only with dy).
struct LayerOutputTensors {
  Tensor y, topk_ids, topk_weights;
  std::optional<MoeGradients> gradients;

  // Allocated for `inputs` (N, H, E, F) and K.
  static LayerOutputTensors allocate(const LayerInputs& inputs, int top_k);
  LayerOutputs views();
};

struct LayerRunResult {
  LayerOutputTensors outputs;
  std::vector<RankReport> ranks;  // rank order
};

// The result on the process that writes the outputs (always, except on MPI
// ranks other than 0: nullopt). Keys and files are validated already.
std::optional<LayerRunResult> run_layer_across_ranks(const LayerInputs& inputs, const MoeLayerConfig& config,
                                                     const ExpertParallelSettings& settings);

}  // namespace epmoe::run
