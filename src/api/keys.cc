// <epmoe/keys.h> on the key registry and translation of `epmoe layer`
// (run/layer_key_groups.h): one vocabulary, one meaning.
#include <epmoe/keys.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/threading.h"
#include "run/layer_key_groups.h"

namespace epmoe {

namespace {

// What the caller's communicator and process decide, not a layer's config.
constexpr std::string_view kRunKeys[] = {"ranks",
                                         "transport",
                                         "threads",
                                         "clock",
                                         "hardware",
                                         "compute_time",
                                         "compute_efficiency",
                                         "compute_scale",
                                         "link_bandwidth_gbps",
                                         "link_latency_us",
                                         "link_topology",
                                         "trace_file",
                                         "fault_injection"};

bool in_group(const run::KeyGroup& group, const std::string& key) {
  return std::any_of(group.keys.begin(), group.keys.end(), [&](const run::KeySpec& spec) { return spec.name == key; });
}

// The keys as assignments, each checked to be a layer's or a group's (and,
// with `allowed`, one of that group's).
enum class Part { both, group, layer };
std::vector<run::KeyAssignment> assignments_of(const std::map<std::string, std::string>& keys, Part part,
                                               const char* origin) {
  static const run::KeyGroup layer_keys = run::moe_layer_keys(), group_keys = run::expert_parallel_keys();
  std::vector<run::KeyAssignment> assignments;
  for (const auto& [key, value] : keys) {
    for (const std::string_view run_key : kRunKeys) {
      if (key == run_key) {
        throw ConfigError(key + "=" + value + " (" + origin +
                          "): describes a run, not a layer on a rank; the per-rank API takes it from the caller's "
                          "communicator and process");
      }
    }
    if (part == Part::group && in_group(layer_keys, key)) {
      throw ConfigError(key + "=" + value + " (" + origin + "): a key of the MoE layer, not of its EP group");
    }
    if (part == Part::layer && in_group(group_keys, key)) {
      throw ConfigError(key + "=" + value + " (" + origin + "): a key of the EP group, not of an MoE layer on it");
    }
    assignments.push_back({key, value, origin});
  }
  return assignments;
}

// The group's config as `epmoe layer` makes it from the same keys. The
// run's keys are refused here, so the run is the per-rank API's: the wall
// clock, the caller's own links (no emulation) and this thread's compute
// threads (run_ranks and epmoe.run_threads give each rank max(1, cores / R),
// as `epmoe layer ranks=R` does), which the replica costs are priced at.
EpConfig group_config_from(const run::ConfigValues& values, const MoeLayerConfig& shape) {
  EpConfig ep = run::ep_config_from(values, shape);
  ep.replica_costs = run::replica_costs_from(values, {}, {}, compute_threads());
  return ep;
}

}  // namespace

LayerConfigs config_from_keys(const std::map<std::string, std::string>& keys, std::int64_t hidden, std::int64_t ffn,
                              int num_experts) {
  const run::ConfigValues values =
      run::layer_key_registry().parse(assignments_of(keys, Part::both, "config_from_keys"));
  LayerConfigs configs;
  configs.layer = run::moe_layer_config_from(values, hidden, ffn, num_experts);
  configs.ep = group_config_from(values, configs.layer);
  return configs;
}

EpConfig ep_config_from_keys(const std::map<std::string, std::string>& keys, int num_experts, int top_k,
                             std::int64_t hidden) {
  const run::ConfigValues values =
      run::layer_key_registry().parse(assignments_of(keys, Part::group, "ep_config_from_keys"));
  // The group needs the layer's shape only: E, K and H.
  MoeLayerConfig shape;
  shape.hidden = hidden;
  shape.router.num_experts = num_experts;
  shape.router.top_k = top_k;
  return group_config_from(values, shape);
}

MoeLayerConfig layer_config_from_keys(const std::map<std::string, std::string>& keys, std::int64_t hidden,
                                      std::int64_t ffn, int num_experts) {
  const run::ConfigValues values =
      run::layer_key_registry().parse(assignments_of(keys, Part::layer, "layer_config_from_keys"));
  return run::moe_layer_config_from(values, hidden, ffn, num_experts);
}

}  // namespace epmoe
