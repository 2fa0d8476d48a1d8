// The typed configuration of epmoe's per-rank engine: an EP group
// (EpConfig, <epmoe/ep_group.h>) and the MoE layers that run on it
// (MoeLayerConfig, <epmoe/moe_layer.h>). Plain values with defaults; each
// validate() throws epmoe::ConfigError naming the key of `epmoe layer` the
// field stands for and the rule broken, so messages read the same whichever
// front end set the value. epmoe::config_from_keys (<epmoe/keys.h>) builds
// both from that key vocabulary ({"dispatch", "ring"}, ...).
//
// Public and std-only.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace epmoe {

// --- the MoE layer ---------------------------------------------------------

// The operand type fed to the expert GEMMs (key compute_dtype).
// Accumulation is always fp32 (DESIGN.md §3): bf16 means bf16 operands,
// fp32 accumulate and fp32 output, the way MoE training runs on
// accelerators. The router stays fp32 either way.
enum class ComputeDType { f32, bf16 };

// Routers (key router; src/moe/router.h describes each in full):
//  * softmax_topk: Mixtral / Qwen / DeepSeek-V2 (n_groups > 1 is
//    group-limited greedy routing);
//  * sigmoid_grouped: DeepSeek-V3 (sigmoid scores, a selection-only bias,
//    group-limited top-K, weights normalised and scaled);
//  * random: uniform logits from a seeded generator (performance runs; the
//    gate's gradient is exactly zero).
enum class RouterKind { softmax_topk, sigmoid_grouped, random };

struct RouterConfig {
  RouterKind kind = RouterKind::softmax_topk;
  int num_experts = 0;                 // E
  int top_k = 2;                       // K
  bool norm_topk_prob = true;          // normalise the K weights
  int n_groups = 1;                    // expert groups for group-limited routing
  int topk_groups = 1;                 // groups kept per token
  float routed_scaling_factor = 1.0f;  // multiplies every routing weight
  std::uint64_t seed = 0;              // random only

  // Throws ConfigError naming the key and the rule: top_k in [1, E],
  // n_groups divides E, topk_groups in [1, n_groups], K <= topk_groups * E/n_groups,
  // at least 2 experts per group when group scores are top-2 sums
  // (sigmoid_grouped, n_groups > 1), routed_scaling_factor finite and > 0.
  void validate() const;
  bool operator==(const RouterConfig&) const = default;
};

// Which expert activations the backward finds saved and which it recomputes
// (DESIGN.md §4.7; key remat_policy, or remat.<name>=save|remat):
//   x_sorted  the expert-sorted input rows with their routing metadata
//             (remat re-runs the dispatch: the all-to-all exchange, or the
//             ring's token all-gather, and the sort);
//   mlpwi_0   x_sorted wi0 [rows, F]   (remat: one grouped GEMM)
//   mlpwi_1   x_sorted wi1 [rows, F]   (remat: one grouped GEMM)
//   mlpwo     the experts' outputs [rows, H] (remat: SwiGLU + one grouped GEMM)
// Gradients are bit-identical whatever the choice.
struct RematPolicy {
  bool save_x_sorted = true;
  bool save_mlpwi_0 = true;
  bool save_mlpwi_1 = true;
  bool save_mlpwo = true;

  // Presets: full = recompute everything, minimal = save everything (the
  // least recompute), save_dispatch = save x_sorted and recompute the rest,
  // custom = save everything (then set the fields). ConfigError naming
  // `key` for an unknown preset.
  static RematPolicy preset(std::string_view key, std::string_view name);
  // "save" / "remat" for one name; ConfigError naming the key otherwise.
  static bool parse_choice(std::string_view key, std::string_view value);
  std::string describe() const;  // "x_sorted=save mlpwi_0=remat ..."
  bool operator==(const RematPolicy&) const = default;
};

struct MoeLayerConfig {
  std::int64_t hidden = 0;  // H
  std::int64_t ffn = 0;     // F
  RouterConfig router;      // router.num_experts is E, router.top_k is K
  ComputeDType compute_dtype = ComputeDType::f32;
  // Opt-in: one product with [wi0 | wi1] per expert, the SwiGLU on it from
  // cache (src/moe/local_experts.h says why it is opt-in).
  bool fuse_up_projection = false;
  RematPolicy remat = {};  // what the backward finds saved (default: everything)
  // Names the layer in error messages ("moe layer 1: ..."); empty means
  // "moe layer". A trainer sets it to the layer's index.
  std::string label = {};  // "= {}" (also on remat): designated initialisers may skip both

  void validate() const;  // ConfigError naming the key
  bool operator==(const MoeLayerConfig&) const = default;
};

// --- the EP group ----------------------------------------------------------

// How tokens reach their experts (key dispatch): the ragged all-to-all
// (DESIGN.md §4.5, with per-rank dedup) or the ring of experts (§4.6: every
// rank all-gathers every token with the bidirectional ring).
enum class DispatchKind { alltoall, ring };
// How token rows travel (key fp8_tokens): f32, or fp8 e4m3 with one scale
// per tensor (from the global absmax) or per token, or bf16 (what the
// accelerators' systems send when they compute in bf16: the baseline that
// fp8's gain is read against). Gradients always travel in f32.
enum class TokenFormat { f32, fp8_tensor, fp8_token, bf16 };
// How the other rows travel (key wire_dtype): the combine's outputs, the
// backward's cotangents (dy rows) and dx, as f32 or as bf16 (rounded to
// nearest even; every sum is still taken in f32, docs/NUMERICS.md derives
// the bound). The key's `auto` is bf16 with compute_dtype=bf16, else f32 (the
// real systems' wire formats), and with bf16 the key layer also sends the
// tokens as bf16 unless fp8_tokens says otherwise; here the two fields are
// independent. The routing-weight gradients always travel in f32.
enum class WireDType { f32, bf16 };
// Ring of experts, backward (key cotangent_all_gather): the output
// cotangent's all-gather is started a chunk ahead and overlapped with
// compute (ring), or issued blocking where it is needed (plain). Same bits.
enum class CotangentAllGather { ring, plain };
// Redundant experts (DESIGN.md §4.8; key balance): off; dynamic, a replica
// plan every step from the step's global counts; or periodic, EPLB-style
// replicas placed from the summed counts of the last balance_window steps
// every balance_period steps and held in between. Homes never move.
enum class BalanceMode { off, dynamic, periodic };
// With replicas, which copy of an expert a (token, k) pair goes to (key
// replica_choice): by position among the source's pairs, or, for the
// all-to-all with dedup, dedup-aware (the same per-copy quotas, pairs
// steered to ranks that already receive the token). The ring and the
// all-to-all without dedup always use the positional rule.
enum class ReplicaChoice { dedup, position };
// When balance=dynamic looks for replicas (key replica_planning, `epmoe
// train` only): exact, every step gathers its counts and plans on them
// (priced plans that place nothing skip the next 1, 2, 4, ... 16 steps);
// forecast, a step looks (the same counts round and exact plan) only when a
// priced plan on the previous step's counts, handed in by the caller from a
// collective it runs anyway (MoeLayer::forecast_replicas: the trainer's
// expert-count exchange), places replicas; otherwise every pair goes home
// and balancing costs the step nothing. A step with no forecast (the first)
// goes home.
enum class ReplicaPlanning { exact, forecast };
// The rates balance=dynamic prices replicas at (docs/BALANCE.md "Cost
// model"): a replica is placed only when the expert compute it takes off
// the busiest rank outweighs its weight, gradient and token transfers.
// All 0 (the default here): unpriced, the plan balances whatever it costs.
// `epmoe layer` / `train` fill them from the hardware (clock=modelled) or
// the link settings and an assumed CPU rate (clock=wall).
struct ReplicaCostRates {
  double compute_flops_per_s = 0;  // one rank's expert GEMMs (peak x efficiency)
  double link_bytes_per_s = 0;     // one link, one direction
  double link_latency_s = 0;
  // Key replica_costs=measured (wall clock): the three rates above are
  // measured by the group's ranks when the first plan is made (a product of
  // one expert's shape; a message of one expert's weights to the next rank
  // and an 8-byte one; the slowest rank's figures, identical on every rank)
  // and replace whatever was set. Plans then depend on the machine's timing:
  // two runs need not place the same replicas, and bits follow the plans.
  bool measure = false;
  bool priced() const { return measure || (compute_flops_per_s > 0 && link_bytes_per_s > 0); }
  bool operator==(const ReplicaCostRates&) const = default;
};

struct EpConfig {
  DispatchKind dispatch = DispatchKind::alltoall;
  int num_experts = 0;           // E, homed E / R per rank (expert e on rank e / (E / R))
  int top_k = 0;                 // K
  std::int64_t hidden = 0;       // H of the token rows
  int num_chunks = 1;            // key token_chunks: the step's pipeline depth
  bool dedup = false;            // alltoall: one row per (token, destination rank)
  double capacity_factor = 0.0;  // alltoall: 0 = exact buffers, never drop
  TokenFormat token_format = TokenFormat::f32;
  WireDType wire_dtype = WireDType::f32;
  CotangentAllGather cotangent_all_gather = CotangentAllGather::ring;
  // Redundant experts: B slots per rank (key redundant_slots, 0 = none),
  // filled per step until max/mean rank load <= rebalance_threshold.
  BalanceMode balance = BalanceMode::off;
  int redundant_slots = 0;
  double rebalance_threshold = 1.05;
  int balance_window = 50;                                    // periodic: steps of counts a placement is made from
  int balance_period = 50;                                    // periodic: steps between placements
  ReplicaChoice replica_choice = ReplicaChoice::dedup;        // alltoall with dedup only
  ReplicaCostRates replica_costs = {};                        // balance=dynamic; unpriced by default
  ReplicaPlanning replica_planning = ReplicaPlanning::exact;  // balance=dynamic
  // The group's collective tags: [tag_base, tag_base + kEpGroupTagRange)
  // (a multiple of 1024); other collectives on the same communicator must
  // stay out of that range.
  std::uint32_t tag_base = 0;
  std::chrono::milliseconds timeout{60'000};  // every wait of a step

  bool replicas_enabled() const { return balance != BalanceMode::off && redundant_slots > 0; }

  // Throws ConfigError: num_experts divisible by ranks, chunks in [1, 64], ...
  void validate(int num_ranks) const;
  bool operator==(const EpConfig&) const = default;
};

// Steps one group can have in flight at once (every layer's forward before
// the first backward, twice over with two micro-batches): each takes 1024
// tags of the group's range, and one more block serves the group itself.
inline constexpr int kEpGroupMaxStepsInFlight = 64;
inline constexpr std::uint32_t kEpGroupTagRange = 1024u * (kEpGroupMaxStepsInFlight + 1);

// The key vocabulary's words for the enums ("alltoall", "tensor", ...).
std::string to_string(DispatchKind kind);
std::string to_string(TokenFormat format);
std::string to_string(WireDType dtype);
std::string to_string(BalanceMode mode);
std::string to_string(ReplicaChoice choice);
std::string to_string(ReplicaPlanning planning);
std::string to_string(ComputeDType dtype);
std::string to_string(RouterKind kind);

}  // namespace epmoe
