// Reports of modelled time (clock=modelled): what one rank's clock did over
// an interval, and the step over all ranks - where each rank's time went
// (compute, communication not hidden, idle waiting on a slower rank), the
// critical path's rank (the one that waited least: the others waited on it)
// and, per kind of collective, how much of it was hidden behind compute.
// Used by `epmoe layer` (metrics.json) and the trainer (metrics.jsonl).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/modelled_clock.h"

namespace epmoe {

struct CollectiveTiming {
  std::string name;  // "all_to_all_v tag 12"
  double start_seconds = 0, end_seconds = 0;
  double exposed_seconds = 0;  // the part its caller waited for (not hidden behind compute)
  std::int64_t bytes_sent = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CollectiveTiming, name, start_seconds, end_seconds, exposed_seconds, bytes_sent)

struct ModelledRankTime {
  double forward_seconds = 0, backward_seconds = 0;
  double compute_seconds = 0, communication_seconds = 0, idle_seconds = 0;
  std::vector<CollectiveTiming> collectives;
  double step_seconds() const { return forward_seconds + backward_seconds; }
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ModelledRankTime, forward_seconds, backward_seconds, compute_seconds,
                                   communication_seconds, idle_seconds, collectives)

// A point on the calling thread's modelled clock.
struct ModelledMark {
  Picoseconds time = 0;
  ModelledTotals totals;
  std::size_t collectives = 0;
};
ModelledMark modelled_mark(const ModelledClock& clock);
// The interval begin..end, split at `middle` into forward and backward.
ModelledRankTime modelled_between(const ModelledClock& clock, const ModelledMark& begin, const ModelledMark& middle,
                                  const ModelledMark& end);

struct ModelledStep {
  double step_seconds = 0;  // the slowest rank's
  int critical_rank = 0;
  // {step_seconds, critical_path_rank, per_rank: [...], collectives: {kind: {count, seconds,
  // exposed_seconds, hidden_fraction, bytes_sent}}}
  nlohmann::json json;
};
ModelledStep modelled_step(const std::vector<ModelledRankTime>& ranks);  // rank order

}  // namespace epmoe
