#include "run/layer_metrics.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>

#include "run/json_output.h"
#include "run/modelled_time_report.h"

namespace epmoe::run {
namespace {

constexpr char kForwardPrefix[] = "forward/";
constexpr char kBackwardPrefix[] = "backward/";

std::int64_t sum_with_prefix(const std::map<std::string, std::int64_t>& bytes_sent, const std::string& prefix) {
  std::int64_t sum = 0;
  for (const auto& [name, bytes] : bytes_sent) {
    if (name.rfind(prefix, 0) == 0) sum += bytes;
  }
  return sum;
}

std::int64_t sum(const std::vector<std::int64_t>& values) {
  std::int64_t total = 0;
  for (std::int64_t value : values) total += value;
  return total;
}

nlohmann::json rank_entry(const RankReport& report) {
  nlohmann::json entry = report;
  entry["rows_received"] = sum(report.rows_per_local_expert) + sum(report.rows_per_slot);
  entry["bytes_sent_forward"] = sum_with_prefix(report.bytes_sent, kForwardPrefix);
  entry["bytes_sent_backward"] = sum_with_prefix(report.bytes_sent, kBackwardPrefix);
  return entry;
}

// The run's dispatcher configuration as it was resolved (ranks from mpirun,
// threads split over ranks), beside the raw keys of "config".
nlohmann::json dispatcher_echo(const ExpertParallelSettings& settings) {
  const EpConfig& ep = settings.ep;
  nlohmann::json links = {{"enabled", settings.links.enabled}};
  if (settings.links.enabled) {
    links["bandwidth_gb_per_s"] = settings.links.bandwidth_gb_per_s;
    links["latency_us"] = settings.links.latency_us;
    links["topology"] = transport::threads::link_topology_name(settings.links.topology);
  }
  return {{"dispatch", to_string(settings.ep.dispatch)},
          {"dedup", ep.dedup},
          {"capacity_factor", ep.capacity_factor},
          {"token_chunks", ep.num_chunks},
          {"fp8_tokens", to_string(ep.token_format)},
          {"wire_dtype", to_string(ep.wire_dtype)},
          {"backward_gradient_dtype", to_string(ep.wire_dtype)},  // dy rows and dx; dweights f32
          {"cotangent_all_gather", settings.cotangent_all_gather},
          {"comm_timeout_ms", ep.timeout.count()},
          {"balance", to_string(ep.balance)},
          {"redundant_slots", ep.redundant_slots},
          {"rebalance_threshold", ep.rebalance_threshold},
          {"balance_window", ep.balance_window},
          {"balance_period", ep.balance_period},
          {"replica_choice", to_string(ep.replica_choice)},
          {"compute_threads_per_rank", settings.compute_threads_per_rank},
          {"emulated_links", links}};
}

// Dynamic replicas (DESIGN.md 4.8): rank loads (rows) before and after the
// plan, max/mean both, weight bytes moved each way, planner time.
nlohmann::json balance_metrics(const ExpertParallelSettings& settings, const std::vector<RankReport>& ranks) {
  const EpConfig& ep = settings.ep;
  nlohmann::json out = {{"mode", to_string(ep.balance)},
                        {"redundant_slots", ep.redundant_slots},
                        {"rebalance_threshold", ep.rebalance_threshold},
                        {"balance_window", ep.balance_window},
                        {"balance_period", ep.balance_period},
                        {"active", ep.replicas_enabled() && !settings.single_rank_local()}};
  if (!out["active"].get<bool>() || ranks.empty()) return out;
  const RankReport& first = ranks.front();
  std::vector<std::int64_t> rows_per_rank;
  std::int64_t weight_bytes = 0, gradient_bytes = 0;
  double planner_seconds = 0;
  for (const RankReport& report : ranks) {
    rows_per_rank.push_back(sum(report.rows_per_local_expert) + sum(report.rows_per_slot));
    if (auto it = report.bytes_sent.find("forward/replica weights"); it != report.bytes_sent.end())
      weight_bytes += it->second;
    if (auto it = report.bytes_sent.find("backward/replica gradients"); it != report.bytes_sent.end())
      gradient_bytes += it->second;
    planner_seconds = std::max(planner_seconds, report.planner_seconds);
  }
  out["num_replicas"] = first.num_replicas;
  out["rank_loads_before"] = first.rank_loads_before;
  out["rank_loads_after"] = first.rank_loads_after;
  out["rows_computed_per_rank"] = rows_per_rank;
  out["max_over_mean_before"] = first.max_over_mean_before;
  out["max_over_mean_after"] = first.max_over_mean_after;
  out["ideal_max_over_mean"] = first.ideal_max_over_mean;  // the best any plan reaches
  out["replica_weight_bytes_forward"] = weight_bytes;
  out["replica_gradient_bytes_backward"] = gradient_bytes;
  out["planner_us"] = planner_seconds * 1e6;
  // The cost model's verdict (docs/BALANCE.md "Cost model"; 0 unpriced).
  out["priced"] = settings.ep.replica_costs.priced();
  out["measured_rates"] = settings.ep.replica_costs.measure;
  out.update(first.replica_verdict);
  return out;
}

}  // namespace

nlohmann::json layer_metrics(const ConfigValues& values, const LayerInputs& in, const MoeLayerConfig& config,
                             const ExpertParallelSettings& settings, const std::vector<RankReport>& ranks,
                             const std::vector<std::string>& output_files) {
  // Totals over ranks. Work and bytes add up; times are the slowest rank's,
  // since the step ends when the last rank does.
  std::vector<std::int64_t> rows_per_expert;  // global expert order
  std::map<std::string, std::int64_t> bytes_sent;
  std::map<std::string, double> phase_seconds;
  std::int64_t dropped_pairs = 0, saved_activation_peak_bytes = 0, recomputed_bytes = 0;
  double forward_seconds = 0, backward_seconds = 0;
  nlohmann::json per_rank = nlohmann::json::array();
  for (const RankReport& report : ranks) {
    rows_per_expert.insert(rows_per_expert.end(), report.rows_per_local_expert.begin(),
                           report.rows_per_local_expert.end());
    for (const auto& [name, bytes] : report.bytes_sent) bytes_sent[name] += bytes;
    for (const auto& [phase, seconds] : report.phase_seconds) {
      phase_seconds[phase] = std::max(phase_seconds[phase], seconds);
    }
    dropped_pairs += report.dropped_pairs;
    saved_activation_peak_bytes = std::max(saved_activation_peak_bytes, report.saved_activation_peak_bytes);
    recomputed_bytes = std::max(recomputed_bytes, report.recomputed_bytes);
    forward_seconds = std::max(forward_seconds, report.forward_seconds);
    backward_seconds = std::max(backward_seconds, report.backward_seconds);
    per_rank.push_back(rank_entry(report));
  }
  // Rows computed in replica slots belong to their expert.
  for (const RankReport& report : ranks)
    for (std::size_t b = 0; b < report.slot_experts.size(); ++b)
      if (report.slot_experts[b] >= 0 && static_cast<std::size_t>(report.slot_experts[b]) < rows_per_expert.size())
        rows_per_expert[report.slot_experts[b]] += report.rows_per_slot[b];
  const std::int64_t routed_pairs = sum(rows_per_expert);

  // Per routed (token, expert) pair the SwiGLU expert runs three [1, H] x
  // [H, F]-sized GEMMs (wi0, wi1, wo) of 2*H*F flops each; the backward runs
  // two per forward GEMM (dlhs and drhs).
  const double forward_gemm_flop =
      6.0 * static_cast<double>(routed_pairs) * static_cast<double>(in.hidden) * static_cast<double>(in.ffn);
  const double gemm_gflop = forward_gemm_flop * (in.dy ? 3.0 : 1.0) / 1e9;
  double expert_seconds = 0;
  for (const char* phase : {"experts", "backward_experts"}) {
    if (const auto found = phase_seconds.find(phase); found != phase_seconds.end()) expert_seconds += found->second;
  }

  nlohmann::json metrics;
  metrics["command"] = "layer";
  metrics["config"] = config_to_json(values);
  metrics["dims"] = {{"num_tokens", in.num_tokens},
                     {"hidden", in.hidden},
                     {"num_experts", in.num_experts},
                     {"ffn", in.ffn},
                     {"top_k", config.router.top_k}};
  metrics["backward"] = in.dy.has_value();
  metrics["bias"] = in.bias.has_value();
  const auto shape_of = [](const TensorView& view) {
    return shape_to_json(Shape(view.shape().begin(), view.shape().end()));
  };
  nlohmann::json shapes = {{"x", shape_of(in.x)},
                           {"gate", shape_of(in.gate)},
                           {"wi0", shape_of(in.wi0)},
                           {"wi1", shape_of(in.wi1)},
                           {"wo", shape_of(in.wo)}};
  if (in.bias) shapes["bias"] = shape_of(*in.bias);
  if (in.dy) shapes["dy"] = shape_of(*in.dy);
  // The outputs have the shapes of a single-rank run.
  const std::int64_t k = config.router.top_k;
  shapes["y"] = shape_to_json({in.num_tokens, in.hidden});
  shapes["topk_ids"] = shape_to_json({in.num_tokens, k});
  shapes["topk_weights"] = shape_to_json({in.num_tokens, k});
  if (in.dy) {
    shapes["dx"] = shape_to_json({in.num_tokens, in.hidden});
    shapes["dgate"] = shape_to_json({in.hidden, in.num_experts});
    shapes["dwi0"] = shape_to_json({in.num_experts, in.hidden, in.ffn});
    shapes["dwi1"] = shape_to_json({in.num_experts, in.hidden, in.ffn});
    shapes["dwo"] = shape_to_json({in.num_experts, in.ffn, in.hidden});
  }
  metrics["shapes"] = shapes;
  metrics["output_files"] = output_files;
  metrics["tokens_per_expert"] = rows_per_expert;
  metrics["balance"] = balance_metrics(settings, ranks);
  metrics["phase_seconds"] = phase_seconds;
  metrics["forward_seconds"] = forward_seconds;
  metrics["backward_seconds"] = backward_seconds;
  metrics["total_seconds"] = forward_seconds + backward_seconds;
  // The rate is over the expert phases (GEMMs plus the SwiGLU between them),
  // so it is comparable with the grouped GEMM benchmark.
  metrics["expert_gemm_gflop"] = gemm_gflop;
  metrics["expert_seconds"] = expert_seconds;
  metrics["expert_gflop_per_second"] = expert_seconds > 0 ? gemm_gflop / expert_seconds : 0.0;
  metrics["saved_activation_peak_bytes"] = saved_activation_peak_bytes;
  // The remat trade (DESIGN.md §4.7), the largest rank's: memory kept for
  // backward against what the backward rebuilt and the extra bytes it sent.
  metrics["remat"] = {{"policy", config.remat.describe()},
                      {"saved_activation_peak_bytes", saved_activation_peak_bytes},
                      {"recomputed_bytes", recomputed_bytes},
                      {"extra_communication_bytes", sum_with_prefix(bytes_sent, "backward/remat")}};

  metrics["expert_parallel"] = {
      {"ranks", settings.num_ranks},
      {"transport", to_string(settings.transport)},
      // single_rank: a single-rank EP group, no communication;
      // dispatcher: an EP group over the transport's communicator.
      {"path", settings.single_rank_local() ? "single_rank" : "dispatcher"},
      {"dispatcher", dispatcher_echo(settings)},
      {"per_rank", per_rank},
      {"total",
       {{"rows_received", routed_pairs},
        {"rows_per_expert", rows_per_expert},
        {"dropped_pairs", dropped_pairs},
        {"bytes_sent", bytes_sent},
        {"bytes_sent_forward", sum_with_prefix(bytes_sent, kForwardPrefix)},
        {"bytes_sent_backward", sum_with_prefix(bytes_sent, kBackwardPrefix)},
        {"phase_seconds_max_over_ranks", phase_seconds}}},
  };
  if (settings.modelled.enabled) {
    std::vector<ModelledRankTime> modelled;
    for (const RankReport& report : ranks) modelled.push_back(report.modelled.value_or(ModelledRankTime{}));
    metrics["modelled"] = modelled_metrics(modelled_step(modelled), settings);
  }
  return metrics;
}

}  // namespace epmoe::run
