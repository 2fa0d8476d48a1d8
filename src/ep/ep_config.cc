#include "ep/ep_config.h"

#include <limits>
#include <utility>

#include "core/error.h"

namespace epmoe::ep {
namespace {

[[noreturn]] void bad_choice(std::string_view key, std::string_view value, const char* choices) {
  throw ConfigError(std::string(key) + "=" + std::string(value) + ": must be one of " + choices);
}

}  // namespace

DispatchKind parse_dispatch_kind(std::string_view key, std::string_view value) {
  if (value == "alltoall") return DispatchKind::alltoall;
  if (value == "ring") return DispatchKind::ring;
  bad_choice(key, value, "alltoall, ring");
}

TokenFormat parse_token_format(std::string_view key, std::string_view value) {
  if (value == "off" || value == "f32") return TokenFormat::f32;
  if (value == "tensor") return TokenFormat::fp8_tensor;
  if (value == "token") return TokenFormat::fp8_token;
  if (value == "bf16") return TokenFormat::bf16;
  bad_choice(key, value, "off, tensor, token, bf16");
}

WireDType parse_wire_dtype(std::string_view key, std::string_view value, ComputeDType compute_dtype) {
  if (value == "auto") return compute_dtype == ComputeDType::bf16 ? WireDType::bf16 : WireDType::f32;
  if (value == "f32") return WireDType::f32;
  if (value == "bf16") return WireDType::bf16;
  bad_choice(key, value, "auto, f32, bf16");
}

CotangentAllGather parse_cotangent_all_gather(std::string_view key, std::string_view value) {
  if (value == "ring") return CotangentAllGather::ring;
  if (value == "plain") return CotangentAllGather::plain;
  bad_choice(key, value, "ring, plain");
}

BalanceMode parse_balance_mode(std::string_view key, std::string_view value) {
  if (value == "off") return BalanceMode::off;
  if (value == "dynamic") return BalanceMode::dynamic;
  if (value == "periodic") return BalanceMode::periodic;
  bad_choice(key, value, "off, dynamic, periodic");
}

ReplicaChoice parse_replica_choice(std::string_view key, std::string_view value) {
  if (value == "dedup") return ReplicaChoice::dedup;
  if (value == "position") return ReplicaChoice::position;
  bad_choice(key, value, "dedup, position");
}

ReplicaPlanning parse_replica_planning(std::string_view key, std::string_view value) {
  if (value == "exact") return ReplicaPlanning::exact;
  if (value == "forecast") return ReplicaPlanning::forecast;
  bad_choice(key, value, "exact, forecast");
}

}  // namespace epmoe::ep

namespace epmoe {

std::string to_string(ReplicaPlanning planning) { return planning == ReplicaPlanning::exact ? "exact" : "forecast"; }

std::string to_string(ReplicaChoice choice) { return choice == ReplicaChoice::dedup ? "dedup" : "position"; }

std::string to_string(BalanceMode mode) {
  switch (mode) {
    case BalanceMode::off:
      return "off";
    case BalanceMode::dynamic:
      return "dynamic";
    case BalanceMode::periodic:
      return "periodic";
  }
  return "?";
}

std::string to_string(DispatchKind kind) { return kind == DispatchKind::ring ? "ring" : "alltoall"; }

std::string to_string(TokenFormat format) {
  switch (format) {
    case TokenFormat::f32:
      return "off";
    case TokenFormat::fp8_tensor:
      return "tensor";
    case TokenFormat::fp8_token:
      return "token";
    case TokenFormat::bf16:
      return "bf16";
  }
  return "?";
}

std::string to_string(WireDType dtype) { return dtype == WireDType::bf16 ? "bf16" : "f32"; }

void EpConfig::validate(int num_ranks) const {
  if (num_ranks < 1) throw ConfigError("ranks=" + std::to_string(num_ranks) + ": must be at least 1");
  if (num_experts < 1 || num_experts % num_ranks != 0)
    throw ConfigError("ranks=" + std::to_string(num_ranks) + ": must divide num_experts=" +
                      std::to_string(num_experts) + " (every rank homes E / ranks experts)");
  if (top_k < 1 || top_k > num_experts)
    throw ConfigError("top_k=" + std::to_string(top_k) + ": must be in [1, num_experts=" + std::to_string(num_experts) +
                      "]");
  if (hidden < 1) throw ConfigError("hidden=" + std::to_string(hidden) + ": must be at least 1");
  if (num_chunks < 1 || num_chunks > 64)
    throw ConfigError("token_chunks=" + std::to_string(num_chunks) + ": must be in [1, 64]");
  if (capacity_factor < 0)
    throw ConfigError("capacity_factor=" + std::to_string(capacity_factor) +
                      ": must be >= 0 (0 = exact buffers, no token dropped)");
  if (redundant_slots < 0 || redundant_slots > 63)
    throw ConfigError("redundant_slots=" + std::to_string(redundant_slots) + ": must be in [0, 63]");
  if (!(rebalance_threshold >= 1.0))
    throw ConfigError("rebalance_threshold=" + std::to_string(rebalance_threshold) +
                      ": must be >= 1 (a max/mean rank load)");
  if (balance_window < 1 || balance_period < 1)
    throw ConfigError("balance_window=" + std::to_string(balance_window) +
                      " balance_period=" + std::to_string(balance_period) + ": both must be at least 1");
  if (replicas_enabled() && capacity_factor > 0)
    throw ConfigError("capacity_factor=" + std::to_string(capacity_factor) + ": not yet supported with balance=" +
                      to_string(balance) + " (replica quotas are exact; use capacity_factor=0)");
  for (const auto& [name, rate] :
       {std::pair<const char*, double>{"compute_flops_per_s", replica_costs.compute_flops_per_s},
        {"link_bytes_per_s", replica_costs.link_bytes_per_s},
        {"link_latency_s", replica_costs.link_latency_s}}) {
    if (!(rate >= 0) || rate == std::numeric_limits<double>::infinity())
      throw ConfigError(std::string("replica_costs.") + name + "=" + std::to_string(rate) +
                        ": must be finite and >= 0 (0 = not priced)");
    if (replica_costs.measure && rate != 0)
      throw ConfigError(std::string("replica_costs.") + name + "=" + std::to_string(rate) +
                        ": replica_costs.measure=true measures the rates; leave them at 0");
  }
  if (tag_base % 1024 != 0) throw ConfigError("tag_base must be a multiple of 1024");
}

}  // namespace epmoe
