// The cost model's verdict on a step's replica plan (docs/BALANCE.md "Cost
// model"), as one JSON object with the names and units every report uses:
// `epmoe layer`'s metrics.json "balance", each line of `epmoe train`'s
// metrics.jsonl ("replica_verdicts", per layer) and Python's
// MoeLayer.last_step_stats(). One function, so the three cannot drift apart.
#pragma once

#include <nlohmann/json.hpp>

#include "ep/replica_stats.h"

namespace epmoe::ep {

// predicted_saving_us, predicted_cost_us (the plan it took), refused_replicas,
// refused_saving_us, refused_cost_us (what the balance-only plan would have
// added beyond it), skipped_planning, priced_at {compute_gflops,
// link_gb_per_s, link_latency_us}. All 0 (false) without replicas or unpriced.
nlohmann::json replica_verdict_json(const ReplicaStats& stats);

}  // namespace epmoe::ep
