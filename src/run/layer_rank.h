// One rank of a whole-world layer run (`epmoe layer`, WholeWorldLayer): the
// rank's share of the full arrays and its step on the per-rank API (an
// EpGroup and a MoeLayer, <epmoe/ep_group.h>, <epmoe/moe_layer.h>), kept
// between runs.
//
// Sharding (the same on every transport): rank r of R holds token rows
// [r·N/R, (r+1)·N/R) of x and dy, and experts [r·E/R, (r+1)·E/R) of wi0,
// wi1 and wo; the gate (and bias) are replicated. Its outputs are the same
// rows of y, topk_ids, topk_weights and dx, the same experts of dwi0, dwi1
// and dwo, and its part of dgate (every rank's part, summed in rank order,
// is dgate: the same order on every transport, so threads and mpi give the
// same bits).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include <epmoe/ep_group.h>
#include <epmoe/moe_layer.h>
#include <epmoe/whole_world_layer.h>

#include "core/memory_ledger.h"
#include "core/tensor.h"
#include "run/expert_parallel_settings.h"
#include "run/layer_inputs.h"
#include "run/rank_report.h"

namespace epmoe::run {

// The layer's EP group's tags: [kLayerTagBase, kLayerTagBase +
// kEpGroupTagRange) (ep/collective_tags.h); a run's own messages go above.
constexpr std::uint32_t kLayerTagBase = 0;

// What a rank keeps from run to run: its group and layer (built for one
// shape of the arrays and rebuilt for another), the ledger both report to,
// and its part of dgate.
struct LayerRank {
  MemoryLedger ledger;
  std::unique_ptr<EpGroup> group;
  std::unique_ptr<MoeLayer> layer;
  Tensor dgate_part;  // [H, E]
};

// Builds `rank`'s group (collective over `comm`; null for a single-rank
// local run; its tags from kLayerTagBase) and layer for `config`.
void build_layer_rank(LayerRank& rank, transport::Communicator* comm, const ExpertParallelSettings& settings,
                      const MoeLayerConfig& config);

// Rank `r`'s rows of the full outputs `out` (empty views stay empty): what
// its step writes in place.
LayerOutputs rank_outputs(const LayerOutputs& out, const ExpertParallelSettings& settings, std::int64_t num_tokens,
                          int r);

// Runs rank `r`'s forward (and backward when inputs.dy is given) on its share
// of `inputs`, writing into `out` (rank_outputs of the full arrays, or the
// rank's own buffers of those shapes) and its dgate part into
// rank.dgate_part; returns what it measured.
RankReport run_layer_rank(LayerRank& rank, const LayerInputs& inputs, const ExpertParallelSettings& settings, int r,
                          const LayerOutputs& out);

// Sums every rank's dgate part into `dgate` in rank order (parts [R] of [H, E]).
void sum_in_rank_order(const std::vector<const float*>& parts, std::int64_t num_elements, float* dgate);

}  // namespace epmoe::run
