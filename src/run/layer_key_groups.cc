#include "run/layer_key_groups.h"

#include "core/error.h"
#include "hardware/replica_cost_rates.h"
#include "run/modelled_time_settings.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>

#include "core/error.h"
#include "core/threading.h"
#include "kernels/compute_dtype.h"
#include "kernels/gemm.h"
#include "moe/router.h"
#include "run/mpi_environment.h"

namespace epmoe::run {

KeyGroup moe_layer_keys() {
  return {
      "MoE layer",
      {
          {.name = "top_k",
           .type = KeyType::integer,
           .default_value = "2",
           .help = "experts per token (K); at most num_experts",
           .min_value = 1},
          {.name = "router",
           .type = KeyType::choice,
           .default_value = to_string(RouterKind::softmax_topk),
           .help = "softmax over the top-K logits (Mixtral/Qwen), DeepSeek-V3 grouped sigmoid, or seeded random ids",
           .choices = {to_string(RouterKind::softmax_topk), to_string(RouterKind::sigmoid_grouped),
                       to_string(RouterKind::random)}},
          {.name = "norm_topk_prob",
           .type = KeyType::boolean,
           .default_value = "true",
           .help = "normalise the K routing weights to sum to 1"},
          {.name = "n_groups",
           .type = KeyType::integer,
           .default_value = "1",
           .help = "expert groups for group-limited routing (softmax_topk: a group scores its max probability, "
                   "DeepSeek-V2; sigmoid_grouped: the sum of its top-2, so >= 2 experts per group); must divide "
                   "num_experts",
           .min_value = 1},
          {.name = "topk_groups",
           .type = KeyType::integer,
           .default_value = "1",
           .help = "groups kept per token (top-K is taken among their experts); at most n_groups",
           .min_value = 1},
          {.name = "routed_scaling_factor",
           .type = KeyType::real,
           .default_value = "1.0",
           .help = "multiplies every routing weight (both routers)",
           .min_value = 0,
           .min_exclusive = true},
          {.name = "compute_dtype",
           .type = KeyType::choice,
           .default_value = to_string(ComputeDType::f32),
           .help = "GEMM operand type; accumulation is always fp32",
           .choices = {to_string(ComputeDType::f32), to_string(ComputeDType::bf16)}},
          {.name = "seed",
           .type = KeyType::integer,
           .default_value = "0",
           .help = "random router: seed of its generator",
           .min_value = 0},
          {.name = "remat_policy",
           .type = KeyType::choice,
           .default_value = "minimal",
           .help = "activations kept for backward: minimal = save all (least recompute), full = recompute "
                   "all (least memory), save_dispatch = save x_sorted only, custom = the remat.* keys",
           .choices = {"minimal", "full", "save_dispatch", "custom"}},
          {.name = "remat.x_sorted",
           .type = KeyType::choice,
           .default_value = "save",
           .help = "remat_policy=custom: the expert-sorted input rows + routing metadata; remat re-runs "
                   "the dispatch (all-to-all exchange or ring all-gather) and the sort in backward",
           .choices = {"save", "remat"}},
          {.name = "remat.mlpwi_0",
           .type = KeyType::choice,
           .default_value = "save",
           .help = "remat_policy=custom: x_sorted wi0 [rows, F]; remat = one grouped GEMM in backward",
           .choices = {"save", "remat"}},
          {.name = "remat.mlpwi_1",
           .type = KeyType::choice,
           .default_value = "save",
           .help = "remat_policy=custom: x_sorted wi1 [rows, F]; remat = one grouped GEMM in backward",
           .choices = {"save", "remat"}},
          {.name = "remat.mlpwo",
           .type = KeyType::choice,
           .default_value = "save",
           .help = "remat_policy=custom: the experts' outputs [rows, H]; remat = SwiGLU + one grouped GEMM",
           .choices = {"save", "remat"}},
      },
  };
}

KeyGroup runtime_keys() {
  return {
      "runtime",
      {
          {.name = "threads",
           .type = KeyType::integer,
           .default_value = std::to_string(hardware_cores()),
           .help = "compute threads (default: every core of this machine), split evenly over "
                   "ranks= ranks; under transport=mpi per process (default: cores / processes here)",
           // Bounded: threads=2000000 crashed the OpenMP runtime (SIGSEGV) instead of failing cleanly.
           // (Never below the default, so a machine with more cores keeps a valid default.)
           .min_value = 1,
           .max_value = std::max(1024, hardware_cores())},
      },
  };
}

KeyGroup expert_parallel_keys() {
  return {
      "expert parallelism (DESIGN.md 4.4-4.6)",
      {
          {.name = "ranks",
           .type = KeyType::integer,
           .default_value = "1",
           .help = "ranks R; rank r holds token rows [r*N/R, (r+1)*N/R) and experts [r*E/R, (r+1)*E/R); "
                   "must divide E (N need not: ranks then hold N/R rounded down or up). transport=mpi: the mpirun "
                   "world size (leave unset)",
           .min_value = 1},
          {.name = "transport",
           .type = KeyType::choice,
           .default_value = "threads",
           .help = "threads: ranks are threads of this process; mpi: one process per rank, "
                   "started as `mpirun -np R epmoe layer ... transport=mpi`",
           .choices = {"threads", "mpi"}},
          {.name = "dispatch",
           .type = KeyType::choice,
           .default_value = to_string(DispatchKind::alltoall),
           .help = "alltoall: ragged all-to-all of (token, expert) rows; ring: all-gather tokens, "
                   "reduce-scatter outputs (ring of experts; wins when R < top_k)",
           .choices = {to_string(DispatchKind::alltoall), to_string(DispatchKind::ring)}},
          {.name = "dedup",
           .type = KeyType::boolean,
           .default_value = "false",
           .help = "alltoall: send a token once per destination rank with its (local expert, weight) "
                   "list, instead of once per routed expert"},
          {.name = "capacity_factor",
           .type = KeyType::real,
           .default_value = "0",
           .help = "alltoall: cap each expert at ceil(factor*N_chunk*K/E) rows per source rank; dropped "
                   "(token, expert) pairs count in metrics.json and add zero; 0 = exact buffers, never drop",
           .min_value = 0},
          {.name = "token_chunks",
           .type = KeyType::integer,
           .default_value = "1",
           .help = "split each rank's tokens into n chunks, pipelined so chunk c+1's communication "
                   "overlaps chunk c's expert compute (forward and backward)",
           .min_value = 1,
           .max_value = 64},
          {.name = "fp8_tokens",
           .type = KeyType::choice,
           .default_value = "off",
           .help = "forward tokens travel as fp8 e4m3 with one global scale (tensor) or one per token, "
                   "or as bf16 (the baseline fp8 halves); dy rows and dx travel as wire_dtype says, the "
                   "routing-weight gradients in fp32",
           .choices = {"off", "tensor", "token", "bf16"}},
          {.name = "wire_dtype",
           .type = KeyType::choice,
           .default_value = "auto",
           .help = "how combine outputs, cotangents (dy rows) and dx travel: f32, or bf16 (rounded once per "
                   "link crossed, summed in f32; then tokens travel as bf16 too unless fp8_tokens is set); "
                   "auto = bf16 with compute_dtype=bf16, else f32",
           .choices = {"auto", "f32", "bf16"}},
          {.name = "cotangent_all_gather",
           .type = KeyType::choice,
           .default_value = "ring",
           .help = "ring dispatch, backward: all-gather dy with the bidirectional ring overlapped with "
                   "compute, or plain (blocking, for comparison; same bits)",
           .choices = {"ring", "plain"}},
          {.name = "link_bandwidth_gbps",
           .type = KeyType::real,
           .default_value = "0",
           .help = "transport=threads: emulated bandwidth per link and direction, GB/s (1e9 B/s); "
                   "0 = no emulation (messages move at memory speed); clock=modelled: overrides the hardware's",
           .min_value = 0},
          {.name = "link_latency_us",
           .type = KeyType::real,
           .default_value = "2",
           .help = "transport=threads: emulated latency per message and link hop, microseconds "
                   "(used when link_bandwidth_gbps > 0)",
           .min_value = 0},
          {.name = "link_topology",
           .type = KeyType::choice,
           .default_value = "full_mesh",
           .help = "transport=threads: links between every pair of ranks, only between ring neighbours "
                   "(other messages hop store-and-forward), through a switch (a rank's sends share its port), "
                   "or two_level (switched groups, scale-out between them; clock=modelled from the hardware)",
           .choices = {"full_mesh", "ring", "switched", "two_level"}},
          {.name = "balance",
           .type = KeyType::choice,
           .default_value = "off",
           .help = "dynamic redundant experts (DESIGN.md 4.8): off, or dynamic = a replica plan every step "
                   "from the all-gathered expert counts, tokens rerouted to replicas with exact quotas, "
                   "replica weights/gradients point to point; periodic = EPLB-style replicas placed from "
                   "the last balance_window steps' counts every balance_period steps (homes fixed)",
           .choices = {"off", "dynamic", "periodic"}},
          {.name = "redundant_slots",
           .type = KeyType::integer,
           .default_value = "0",
           .help = "balance=dynamic: B redundant expert slots per rank, each able to hold one replica of "
                   "another rank's expert",
           .min_value = 0,
           .max_value = 63},
          {.name = "rebalance_threshold",
           .type = KeyType::real,
           .default_value = "1.05",
           .help = "balance=dynamic: stop adding replicas once max/mean rank load (rows) is at or below this",
           .min_value = 1},
          {.name = "replica_costs",
           .type = KeyType::choice,
           // The per-rank key API prices at the same rates (replica_costs_from),
           // so a per-rank layer plans as `epmoe layer` does on the same keys.
           .default_value = "priced",
           .help = "balance=dynamic: priced = a replica is placed only when the compute it takes off the busiest "
                   "rank outweighs its weight, gradient and token transfers at the hardware's (clock=modelled) or "
                   "the links' and an assumed CPU's rates (docs/BALANCE.md, Cost model); measured = priced at "
                   "rates the ranks measure at the first plan (clock=wall; plans then follow the machine's "
                   "timing); off = balance as far as rebalance_threshold asks, whatever it costs",
           .choices = {"priced", "measured", "off"}},
          {.name = "balance_window",
           .type = KeyType::integer,
           .default_value = "50",
           .help = "balance=periodic: steps of expert counts a placement is made from",
           .min_value = 1},
          {.name = "balance_period",
           .type = KeyType::integer,
           .default_value = "50",
           .help = "balance=periodic: steps between placements (held in between)",
           .min_value = 1},
          {.name = "replica_choice",
           .type = KeyType::choice,
           .default_value = to_string(ReplicaChoice::dedup),
           .help = "balance on, dispatch=alltoall dedup=true: which copy of a replicated expert a (token, expert) "
                   "pair goes to; dedup = prefer a copy on a rank that already receives the token (fewer rows, "
                   "same rows per copy), position = by position among the source's pairs; both within the "
                   "locality-first per-(source, copy) sub-quotas (balance/replica_plan.h)",
           .choices = {to_string(ReplicaChoice::dedup), to_string(ReplicaChoice::position)}},
          {.name = "comm_timeout_ms",
           .type = KeyType::integer,
           .default_value = "60000",
           .help = "a wait for a peer longer than this fails the run with an error naming the peer; at most "
                   "a day",
           // Bounded: now + 2^63-1 ms overflowed the deadline, which then expired at once ("timed out after 0 ms").
           .min_value = 1,
           .max_value = 86400000},
          {.name = "fault_injection",
           .type = KeyType::text,
           .default_value = "",
           .help = "TEST HOOK, not for real runs: RANK:POINT[:throw|kill|stop[:NTH]] makes rank RANK fail at "
                   "POINT (collective, dispatch, checkpoint) the NTH time it gets there (docs/RELIABILITY.md)"},
      },
  };
}

MoeLayerConfig moe_layer_config_from(const ConfigValues& values, std::int64_t hidden, std::int64_t ffn,
                                     std::int64_t num_experts) {
  if (num_experts > std::numeric_limits<int>::max()) {
    throw ConfigError("num_experts=" + std::to_string(num_experts) +
                      ": must be <= " + std::to_string(std::numeric_limits<int>::max()));
  }
  MoeLayerConfig config;
  config.hidden = hidden;
  config.ffn = ffn;
  config.compute_dtype = parse_compute_dtype("compute_dtype", values.get_string("compute_dtype"));
  if (config.compute_dtype == ComputeDType::bf16 && !bf16_gemm_supported()) {
    throw ConfigError(
        "compute_dtype=bf16: oneDNN has no bf16 matmul on this CPU (its bf16 kernels need "
        "AVX-512 with BF16 or AMX); use compute_dtype=f32");
  }
  RouterConfig& router = config.router;
  router.kind = parse_router_kind("router", values.get_string("router"));
  router.num_experts = static_cast<int>(num_experts);
  router.top_k = values.get_int32("top_k");
  router.norm_topk_prob = values.get_bool("norm_topk_prob");
  router.n_groups = values.get_int32("n_groups");
  router.topk_groups = values.get_int32("topk_groups");
  router.routed_scaling_factor = static_cast<float>(values.get_float("routed_scaling_factor"));
  router.seed = static_cast<std::uint64_t>(values.get_int("seed"));  // >= 0 by its declaration
  const std::string policy = values.get_string("remat_policy");
  config.remat = RematPolicy::preset("remat_policy", policy);
  for (const char* key : {"remat.x_sorted", "remat.mlpwi_0", "remat.mlpwi_1", "remat.mlpwo"}) {
    if (policy != "custom" && values.is_set(key))
      throw ConfigError(std::string(key) + " is only read with remat_policy=custom (it is " + policy + ")");
  }
  if (policy == "custom") {
    config.remat.save_x_sorted = RematPolicy::parse_choice("remat.x_sorted", values.get_string("remat.x_sorted"));
    config.remat.save_mlpwi_0 = RematPolicy::parse_choice("remat.mlpwi_0", values.get_string("remat.mlpwi_0"));
    config.remat.save_mlpwi_1 = RematPolicy::parse_choice("remat.mlpwi_1", values.get_string("remat.mlpwi_1"));
    config.remat.save_mlpwo = RematPolicy::parse_choice("remat.mlpwo", values.get_string("remat.mlpwo"));
  }
  config.validate();  // validates the router config too
  return config;
}

namespace {

// The rank count: ranks= on threads; the world size under mpirun, where
// ranks= may only repeat it.
int rank_count(const ConfigValues& values, TransportKind transport) {
  if (transport == TransportKind::threads) return values.get_int32("ranks");
  const std::optional<MpiLaunch> launch = mpi_launch_from_environment();
  if (!launch) {
    throw ConfigError(
        "transport=mpi: not started by mpirun (no OMPI_COMM_WORLD_SIZE or PMI_SIZE in the "
        "environment); run `mpirun -np R epmoe layer ... transport=mpi`, or use "
        "transport=threads ranks=R");
  }
  if (!mpi_transport_built()) {
    throw ConfigError(
        "transport=mpi: this epmoe was built without the mpi transport "
        "(EPMOE_WITH_MPI=OFF, or no MPI found when it was configured); use transport=threads");
  }
  if (values.is_set("ranks") && values.get_int("ranks") != launch->world_size) {
    throw ConfigError(values.setting("ranks") +
                      ": under transport=mpi the rank count is the mpirun world "
                      "size (" +
                      std::to_string(launch->world_size) +
                      "); leave ranks unset or set ranks=" + std::to_string(launch->world_size));
  }
  return launch->world_size;
}

// A key that only one dispatcher reads, set away from its default with the
// other one, would be silently ignored: the user believes the run used it.
void check_dispatcher_specific_keys(const ConfigValues& values, const EpConfig& ep) {
  if (ep.dispatch == DispatchKind::ring) {
    if (ep.capacity_factor > 0) {
      throw ConfigError(values.setting("capacity_factor") +
                        ": applies to dispatch=alltoall only; "
                        "dispatch=ring moves every token to every rank and never drops (use capacity_factor=0)");
    }
    if (ep.dedup) {
      throw ConfigError(
          "dedup=true: applies to dispatch=alltoall only; dispatch=ring already sends each "
          "token once to every rank");
    }
  } else if (ep.cotangent_all_gather != CotangentAllGather::ring) {
    throw ConfigError(values.setting("cotangent_all_gather") +
                      ": applies to dispatch=ring only (the "
                      "all-to-all backward sends dy rows point to point, it has no cotangent all-gather)");
  }
  // Only the all-to-all with dedup chooses among copies; elsewhere the
  // positional rule holds whatever the key says.
  if (values.is_set("replica_choice") &&
      !(ep.dispatch == DispatchKind::alltoall && ep.dedup && ep.replicas_enabled())) {
    throw ConfigError(values.setting("replica_choice") +
                      ": applies to dispatch=alltoall dedup=true with replicas "
                      "(balance=dynamic|periodic, redundant_slots > 0) only; elsewhere pairs go to copies by "
                      "position within the locality-first sub-quotas");
  }
}

}  // namespace

EpConfig ep_config_from(const ConfigValues& values, const MoeLayerConfig& layer) {
  EpConfig ep;
  ep.dispatch = ep::parse_dispatch_kind("dispatch", values.get_string("dispatch"));
  ep.num_experts = layer.router.num_experts;
  ep.top_k = layer.router.top_k;
  ep.hidden = layer.hidden;
  ep.num_chunks = values.get_int32("token_chunks");
  ep.dedup = values.get_bool("dedup");
  ep.capacity_factor = values.get_float("capacity_factor");
  ep.token_format = ep::parse_token_format("fp8_tokens", values.get_string("fp8_tokens"));
  ep.wire_dtype = ep::parse_wire_dtype("wire_dtype", values.get_string("wire_dtype"), layer.compute_dtype);
  // The accelerators' systems that send bf16 send their tokens in bf16 too;
  // an explicit fp8_tokens (fp8, or off for f32 tokens) still decides.
  if (ep.wire_dtype == WireDType::bf16 && !values.is_set("fp8_tokens")) ep.token_format = TokenFormat::bf16;
  ep.cotangent_all_gather =
      ep::parse_cotangent_all_gather("cotangent_all_gather", values.get_string("cotangent_all_gather"));
  ep.timeout = std::chrono::milliseconds(values.get_int("comm_timeout_ms"));
  ep.balance = ep::parse_balance_mode("balance", values.get_string("balance"));
  ep.redundant_slots = values.get_int32("redundant_slots");
  ep.rebalance_threshold = values.get_float("rebalance_threshold");
  ep.balance_window = values.get_int32("balance_window");
  ep.balance_period = values.get_int32("balance_period");
  ep.replica_choice = ep::parse_replica_choice("replica_choice", values.get_string("replica_choice"));
  check_dispatcher_specific_keys(values, ep);
  return ep;
}

ExpertParallelSettings expert_parallel_settings_from(const ConfigValues& values, const MoeLayerConfig& layer) {
  ExpertParallelSettings settings;
  check_modelled_time_transport(values);
  settings.transport = values.get_string("transport") == "mpi" ? TransportKind::mpi : TransportKind::threads;
  settings.num_ranks = rank_count(values, settings.transport);
  const int num_ranks = settings.num_ranks;
  settings.cotangent_all_gather = values.get_string("cotangent_all_gather");
  EpConfig& ep = settings.ep;
  ep = ep_config_from(values, layer);
  if (settings.transport == TransportKind::mpi && !values.is_set("ranks")) {
    // EpConfig names the rank count "ranks=R"; say where R came from.
    try {
      ep.validate(num_ranks);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string(e.what()) + " (the mpirun world size)");
    }
  } else {
    ep.validate(num_ranks);  // ranks divides E; the other fields are bounded by their keys
  }

  transport::threads::EmulatedLinkOptions& links = settings.links;
  links.enabled = values.get_float("link_bandwidth_gbps") > 0;
  if (links.enabled && settings.transport == TransportKind::mpi) {
    throw ConfigError(values.setting("link_bandwidth_gbps") +
                      ": link emulation applies to "
                      "transport=threads only; under transport=mpi messages cross the real links");
  }
  if (links.enabled) links.bandwidth_gb_per_s = values.get_float("link_bandwidth_gbps");
  links.latency_us = values.get_float("link_latency_us");
  links.topology = transport::threads::parse_link_topology("link_topology", values.get_string("link_topology"));
  links.validate();
  configure_modelled_time(values, settings);

  // Ranks share the machine's cores: threads= is the budget of the whole
  // run, split evenly (at least one each). Under mpirun each process only
  // knows its own budget, so threads= applies per process when given, and the
  // default splits the cores among the job's processes on this machine.
  const int threads = values.get_int32("threads");
  if (settings.transport == TransportKind::threads) {
    settings.compute_threads_per_rank = std::max(1, threads / num_ranks);
  } else if (values.is_set("threads")) {
    settings.compute_threads_per_rank = threads;
  } else {
    const int local_size = mpi_launch_from_environment().value_or(MpiLaunch{}).local_size;
    settings.compute_threads_per_rank = std::max(1, hardware_cores() / local_size);
  }
  ep.replica_costs = replica_costs_from(values, settings.modelled, settings.links, settings.compute_threads_per_rank);
  return settings;
}

ReplicaCostRates replica_costs_from(const ConfigValues& values, const hardware::ModelledTimeOptions& modelled,
                                    const hardware::EmulatedLinkOptions& links, int compute_threads_per_rank) {
  const std::string& choice = values.get_string("replica_costs");
  if (choice == "measured") {
    if (modelled.enabled)
      throw ConfigError(
          "replica_costs=measured: the modelled clock prices at the hardware's rates; use replica_costs=priced "
          "(measured rates are for clock=wall)");
    return {.measure = true};
  }
  if (choice != "priced") return {};
  return hardware::replica_cost_rates(modelled, links, compute_threads_per_rank);
}

void apply_runtime_keys(const ConfigValues& values) { set_compute_threads(values.get_int32("threads")); }

const KeyRegistry& layer_key_registry() {
  static const KeyRegistry registry("layer",
                                    {moe_layer_keys(), expert_parallel_keys(), modelled_time_keys(), runtime_keys()});
  return registry;
}

}  // namespace epmoe::run
