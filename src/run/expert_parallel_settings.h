// How `epmoe layer` and `train` run a layer across ranks: the
// validated translation of expert_parallel_keys() (run/layer_key_groups.h).
//
// Sharding (the same on both transports): rank r of R holds token rows
// [r·N/R, (r+1)·N/R) of x and dy, and experts [r·E/R, (r+1)·E/R) of wi0, wi1
// and wo; the gate (and bias) are replicated.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <epmoe/ep_group.h>

#include "core/fault_injection.h"
#include "core/trace_recorder.h"
#include "ep/ep_config.h"
#include "transport/threads/emulated_links.h"
#include "transport/threads/virtual_timeline.h"

namespace epmoe::run {

enum class TransportKind { threads, mpi };
std::string to_string(TransportKind kind);

struct ExpertParallelSettings {
  int num_ranks = 1;
  TransportKind transport = TransportKind::threads;
  EpConfig ep;                                       // validated for num_ranks (ep.dispatch: the dispatcher)
  std::string cotangent_all_gather = "ring";         // as given, for the metrics echo
  transport::threads::EmulatedLinkOptions links;     // threads only; enabled = emulate
  transport::threads::ModelledTimeOptions modelled;  // clock=modelled (run/modelled_time_settings.h)
  std::string hardware;                              // clock=modelled: the device's name
  std::string trace_file;                            // empty: no trace
  TraceRecorder* trace = nullptr;                    // set by the command when trace_file is given
  FaultInjector* faults = nullptr;                   // fault_injection= (run/run_faults.h); owned by the command
  int compute_threads_per_rank = 1;                  // OpenMP budget of each rank

  // True when the run needs no dispatcher: one rank on threads and no key
  // that only a dispatcher implements (ring, dedup, capacity, fp8 tokens).
  // Then the layer runs as MoeLayer with its LocalDispatcher on the calling
  // thread, bit for bit the same results.
  bool single_rank_local() const;

  // This rank's EP group: a single-rank group (no communication) when
  // single_rank_local(), else a group over `comm` (collective). Its tags
  // start at `tag_base`.
  std::unique_ptr<EpGroup> make_group(transport::Communicator* comm, std::uint32_t tag_base,
                                      MemoryLedger* ledger = nullptr) const;

  std::int64_t first_token(int rank, std::int64_t num_tokens) const { return num_tokens * rank / num_ranks; }
  int num_local_experts() const { return ep.num_experts / num_ranks; }
};

}  // namespace epmoe::run
