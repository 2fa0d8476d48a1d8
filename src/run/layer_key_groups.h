// Key groups shared by what runs MoE layers (`epmoe layer` and `train`, the
// public API, the Python module), and their translation into the library's
// config structs. The translation is the only place that knows both the key names
// and the structs; validation of cross-key rules (top_k <= E, n_groups
// divides E, ...) stays in the structs' validate().
#pragma once

#include <cstdint>

#include <epmoe/moe_layer.h>

#include "run/config_keys.h"
#include "run/expert_parallel_settings.h"

namespace epmoe::run {

// top_k, router, norm_topk_prob, n_groups, topk_groups, routed_scaling_factor,
// compute_dtype, seed.
KeyGroup moe_layer_keys();
// threads.
KeyGroup runtime_keys();
// ranks, transport, dispatch, dedup, capacity_factor, token_chunks,
// fp8_tokens, cotangent_all_gather, link_bandwidth_gbps, link_latency_us,
// link_topology, comm_timeout_ms, fault_injection (a test hook).
KeyGroup expert_parallel_keys();

// Every key of `epmoe layer`: moe_layer_keys(), expert_parallel_keys(),
// modelled_time_keys() and runtime_keys(). The public API (src/api) takes the
// same keys.
const KeyRegistry& layer_key_registry();

// The layer config for the given dimensions (from the input files) and the
// keys of moe_layer_keys(); validated, so it throws ConfigError naming the key
// and the rule.
MoeLayerConfig moe_layer_config_from(const ConfigValues& values, std::int64_t hidden, std::int64_t ffn,
                                     std::int64_t num_experts);

// The keys of expert_parallel_keys() (and `threads` of runtime_keys(), split
// over the ranks). Checks every rule that can be checked before MPI_Init or
// any compute: the rank count divides E (N need not: rank r holds token rows
// [r*N/R, (r+1)*N/R)), transport=mpi runs under mpirun with ranks= left unset or equal to the
// world size, each dispatcher-specific key is non-default only with the
// dispatcher that uses it, link emulation only on threads. ConfigError naming
// the key and the rule. fault_injection= is the caller's to turn into the
// run's injector (run/run_faults.h).
ExpertParallelSettings expert_parallel_settings_from(const ConfigValues& values, const MoeLayerConfig& layer);
// Just the EP group's configuration of those keys (no rank count: not
// validated for one; the dispatcher-specific keys are checked), unpriced:
// replica_costs_from gives the rates.
EpConfig ep_config_from(const ConfigValues& values, const MoeLayerConfig& layer);
// The rates replica_costs=priced prices replicas at
// (hardware/replica_cost_rates.h), {} (unpriced) with replica_costs=off: the
// run's clock and links and one rank's compute threads. The one rule of
// `epmoe layer`, `epmoe train` and the per-rank key API (<epmoe/keys.h>),
// which runs on the wall clock over the caller's own links (neither option
// enabled) with the calling thread's compute threads, so that a per-rank
// group and `epmoe layer` plan the same replicas on the same keys.
ReplicaCostRates replica_costs_from(const ConfigValues& values, const hardware::ModelledTimeOptions& modelled,
                                    const hardware::EmulatedLinkOptions& links, int compute_threads_per_rank);

// Applies runtime_keys() to the calling thread (its compute thread budget).
void apply_runtime_keys(const ConfigValues& values);

}  // namespace epmoe::run
