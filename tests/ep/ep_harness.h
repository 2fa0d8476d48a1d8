// Runs one MoE layer forward + backward over R ranks as threads, each rank
// holding tokens [r·N/R, (r+1)·N/R) (or EpRunOptions::tokens_by_rank) and experts [r·E/R, (r+1)·E/R), and
// gathers the results back into single-rank shapes (dgate summed over
// ranks) so they compare directly with the double reference.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <epmoe/moe_layer.h>

#include "core/fault_injection.h"
#include "core/modelled_clock.h"
#include "ep/ep_config.h"
#include "ep/replica_stats.h"
#include "ep/step_state.h"
#include "reference_moe.h"
#include "transport/threads/launcher.h"

namespace epmoe::testing {

struct EpRunOptions {
  int num_ranks = 1;
  DispatchKind dispatch = DispatchKind::alltoall;
  EpConfig ep = {};  // num_experts, top_k, hidden are filled from the problem
  ComputeDType compute_dtype = ComputeDType::f32;
  RematPolicy remat = {};
  // Steps of forward + backward on the same problem; with dynamic replicas
  // (ep.balance, ep.redundant_slots), step i passes weight_versions[i] to the
  // layer (empty: one step, the layer's automatic version). Results are the
  // last step's.
  std::vector<std::uint64_t> weight_versions = {};
  // Tokens each rank holds, in rank order, summing to N (3 and 5 on two
  // ranks, zeros allowed); empty: rank r holds [r·N/R, (r+1)·N/R).
  std::vector<std::int64_t> tokens_by_rank = {};
  // clock=modelled (transport/threads/virtual_timeline.h) and its links; off: wall.
  transport::threads::ModelledTimeOptions modelled = {};
  transport::threads::EmulatedLinkOptions links = {};
  // The layer's split-phase calls with other work between each begin and
  // its finish (an all-reduce in flight, and compute), instead of forward()
  // and backward(): the results must not change by a bit.
  bool split_phase_with_other_work = false;
  // OpenMP compute threads of each rank thread (core/threading.h).
  int compute_threads_per_rank = 1;
  // R = 1 only: the layer runs on a LocalDispatcher (no communication)
  // instead of `dispatch`'s.
  bool local_dispatcher = false;
  // The run's fault injection (core/fault_injection.h): every rank thread
  // works in its scope; nullptr: none.
  FaultInjector* faults = nullptr;
};

// What one rank's memory ledger and layer saw.
struct RankMemory {
  std::map<std::string, std::int64_t> peak_bytes_by_name;
  std::map<std::string, std::int64_t> live_bytes_by_name;  // after the last step, the layer alive
  std::int64_t saved_peak_bytes = 0;                       // the "saved" group: activations held for the backward
  std::int64_t total_peak_bytes = 0;                       // saved activations and the dispatcher's buffers
  std::int64_t recomputed_bytes = 0;
};

struct EpRunResult {
  Tensor y = {}, topk_ids = {}, topk_weights = {};
  MoeGradients grads = {};                                      // gathered: dx [N,H], dgate summed, dW [E,...]
  std::vector<ep::DispatchStats> stats = {};                    // per rank, last step
  std::vector<RankMemory> memory = {};                          // per rank
  std::vector<std::vector<ep::DispatchStats>> step_stats = {};  // [step][rank]
  // The replica exchange's (MoeLayer::replica_stats; all-default without
  // replicas), as stats and step_stats.
  std::vector<ep::ReplicaStats> replica_stats = {};                    // per rank, last step
  std::vector<std::vector<ep::ReplicaStats>> step_replica_stats = {};  // [step][rank]
  // What the threads transport itself counted each rank sending to the
  // others (Communicator::sent_bytes) over a step's forward + backward (with
  // split_phase_with_other_work, the other work's all-reduces included).
  std::vector<transport::SentBytes> transport_sent = {};                    // per rank, last step
  std::vector<std::vector<transport::SentBytes>> step_transport_sent = {};  // [step][rank]
  // The same bytes by tag (ThreadsCommunicator::sent_bytes_by_tag), to tell
  // the streams of a collective apart (comm/tag.h).
  std::vector<std::vector<std::map<transport::Tag, std::int64_t>>> step_transport_sent_by_tag = {};  // [step][rank]
  // clock=modelled: each rank's clock when every step began and ended,
  // [step][rank] (all 0 on the wall clock).
  std::vector<std::vector<Picoseconds>> step_modelled_start = {}, step_modelled_end = {};
  // A step's modelled time: the last rank's end - the first rank's start.
  Picoseconds modelled_step(std::size_t step) const;
};

EpRunResult run_ep_layer(const MoeProblem& problem, const EpRunOptions& options);

// The expert ids of a topk_ids tensor, as the reference takes them.
inline std::vector<std::int32_t> ids_of(const Tensor& topk_ids) {
  return {topk_ids.span<std::int32_t>().begin(), topk_ids.span<std::int32_t>().end()};
}

// Slices rows [begin, end) of the leading dimension.
Tensor slice_rows(const Tensor& t, std::int64_t begin, std::int64_t end);

}  // namespace epmoe::testing
