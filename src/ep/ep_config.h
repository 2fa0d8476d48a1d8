// Configuration shared by the expert-parallel dispatchers: a validated value
// type (STYLE.md) whose errors name the key and the rule.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ep/dispatcher.h"
#include "ep/token_format.h"

namespace epmoe::transport {
class Communicator;
}

namespace epmoe::ep {

enum class DispatchKind { alltoall, ring };
// Ring of experts, backward: the output cotangent's all-gather is started
// ahead and overlapped with compute (ring), or issued blocking where it is
// needed (plain). Same bits either way.
enum class CotangentAllGather { ring, plain };
// Redundant experts (DESIGN.md §4.8, ep/replica_exchange.h): off; dynamic,
// a replica plan every step from the step's global counts; or periodic,
// EPLB-style replicas placed from the summed counts of the last
// balance_window steps every balance_period steps and held in between
// (balance/periodic_replicas.h). Homes never move in the engine.
enum class BalanceMode { off, dynamic, periodic };
// With replicas, which copy of an expert a (token, k) pair goes to, within
// the plan's locality-first per-(source, copy) sub-quotas
// (balance/replica_plan.h): by position among the source's pairs, or, for
// the all-to-all with dedup, dedup-aware (balance/dedup_aware_choice.h: the
// same sub-quotas, pairs steered to ranks that already receive the token). The ring
// and the all-to-all without dedup always use the positional rule.
enum class ReplicaChoice { dedup, position };

DispatchKind parse_dispatch_kind(std::string_view key, std::string_view value);
TokenFormat parse_token_format(std::string_view key, std::string_view value);
CotangentAllGather parse_cotangent_all_gather(std::string_view key, std::string_view value);
BalanceMode parse_balance_mode(std::string_view key, std::string_view value);
ReplicaChoice parse_replica_choice(std::string_view key, std::string_view value);
std::string to_string(ReplicaChoice choice);
std::string to_string(DispatchKind kind);
std::string to_string(BalanceMode mode);
std::string to_string(TokenFormat format);

struct EpConfig {
  int num_experts = 0;
  int top_k = 0;
  std::int64_t hidden = 0;
  int num_chunks = 1;            // key token_chunks
  bool dedup = false;            // alltoall: one row per (token, destination rank)
  double capacity_factor = 0.0;  // alltoall: 0 = exact buffers, never drop
  TokenFormat token_format = TokenFormat::f32;
  CotangentAllGather cotangent_all_gather = CotangentAllGather::ring;
  // Dynamic replicas: B redundant expert slots per rank (key redundant_slots,
  // 0 = none), filled per step until max/mean rank load <= rebalance_threshold.
  BalanceMode balance = BalanceMode::off;
  int redundant_slots = 0;
  double rebalance_threshold = 1.05;
  int balance_window = 50;                              // periodic: steps of counts a placement is made from
  int balance_period = 50;                              // periodic: steps between placements
  ReplicaChoice replica_choice = ReplicaChoice::dedup;  // alltoall with dedup only
  std::uint32_t tag_base = 0;                           // separates layers' collectives; a multiple of 1024
  std::chrono::milliseconds timeout{60'000};

  bool replicas_enabled() const { return balance != BalanceMode::off && redundant_slots > 0; }

  // Throws ConfigError: num_experts divisible by ranks, chunks >= 1, ...
  void validate(int num_ranks) const;
};

std::unique_ptr<Dispatcher> make_dispatcher(DispatchKind kind, transport::Communicator& comm, const EpConfig& config);

}  // namespace epmoe::ep
