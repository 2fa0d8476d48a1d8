// The key vocabulary of `epmoe layer` (`epmoe layer --help` lists every key
// with its type and default) turned into the typed configurations of the
// per-rank API (<epmoe/config.h>): an optional helper for callers that keep
// their settings as text (a YAML file, a command line, Python keyword
// arguments), so that a setting means the same everywhere.
//
//   epmoe::LayerConfigs c = epmoe::config_from_keys({{"dispatch", "ring"}, {"top_k", "2"},
//                                                    {"token_chunks", "4"}}, hidden, ffn, num_experts);
//   epmoe::EpGroup group(comm, c.ep);
//   epmoe::MoeLayer layer(c.layer, group);
//
// The shape (hidden, ffn, num_experts) comes from the arguments, as it comes
// from the arrays in `epmoe layer`. Keys that describe a run rather than a
// layer on a rank (ranks, transport, threads, clock and the modelled
// hardware, link emulation, trace_file, fault_injection) are refused: the
// caller's communicator and process decide those. So the group runs as
// `epmoe layer` does with those keys at their defaults (the wall clock, no
// link emulation), and replica_costs=priced (the default with
// balance=dynamic) prices replicas at the rates `epmoe layer` derives for
// that run: an assumed CPU rate times the compute threads of the thread
// that calls these functions (run_ranks gives each rank max(1, cores / R),
// as `epmoe layer ranks=R` does; under MPI, OMP_NUM_THREADS), so that a
// per-rank group and `epmoe layer` plan the same replicas (docs/BALANCE.md,
// "Rates"). Ranks whose rates differ are refused by EpGroup, naming
// replica_costs.compute_flops_per_s.
//
// Public and std-only.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <epmoe/config.h>

namespace epmoe {

struct LayerConfigs {
  EpConfig ep;           // not yet validated for a rank count: EpGroup does that
  MoeLayerConfig layer;  // validated
};

// Both from one set of keys. ConfigError naming the key and the rule for an
// unknown key, a bad value, or a run-level key.
LayerConfigs config_from_keys(const std::map<std::string, std::string>& keys, std::int64_t hidden, std::int64_t ffn,
                              int num_experts);
// The group's keys alone (dispatch, dedup, capacity_factor, token_chunks,
// fp8_tokens, wire_dtype, cotangent_all_gather, balance, redundant_slots,
// rebalance_threshold, replica_costs, balance_window, balance_period,
// replica_choice, comm_timeout_ms); a layer's key is refused, naming where it belongs.
// wire_dtype=auto means f32 here (no layer, so no compute_dtype to follow).
EpConfig ep_config_from_keys(const std::map<std::string, std::string>& keys, int num_experts, int top_k,
                             std::int64_t hidden);
// The layer's keys alone (top_k, router, norm_topk_prob, n_groups,
// topk_groups, routed_scaling_factor, compute_dtype, seed, remat_policy,
// remat.<name>); a group's key is refused, naming where it belongs.
MoeLayerConfig layer_config_from_keys(const std::map<std::string, std::string>& keys, std::int64_t hidden,
                                      std::int64_t ffn, int num_experts);

}  // namespace epmoe
