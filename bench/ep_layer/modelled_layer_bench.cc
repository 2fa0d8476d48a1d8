// `epmoe-bench layer clock=modelled`: the expert-parallel layer, forward +
// backward, on the modelled clock (DESIGN.md §4.11), per hardware preset
// (bench/collectives/modelled_hardware.h), one table per claim of the seeds:
//
//   cotangent  cotangent_all_gather=ring (async, a chunk ahead) vs plain
//              (blocking where needed): step and backward time, and the
//              cotangent all-gather's hidden fraction (1 - exposed/duration,
//              summed over ranks and chunks);
//   chunks     token_chunks 1/2/4 against the two-resource pipeline formula
//              T(n) = T(1) - L - X + max(L, X) + min(L, X)/n per pass, L =
//              the pass's communication phases and X its expert compute at
//              n = 1 (forward: dispatch + combine vs experts; backward:
//              backward_combine + backward_dispatch vs backward_experts +
//              backward_remat_*), on the critical rank;
//   remat      remat.x_sorted save vs remat (and the presets around it):
//              peak saved-activation bytes (the layer's MemoryLedger),
//              backward time, backward bytes sent, bytes recomputed;
//   dedup      the all-to-all with and without per-rank token dedup (and the
//              ring): forward token bytes against DESIGN.md §4.6's formulas,
//              forward and step time;
//   replicas   balance=dynamic redundant_slots=0/1/2 under packed Zipf
//              routing (sigmoid_grouped with a Zipf selection bias, hot
//              experts on rank 0, balance/routing_skew.h): step time, the
//              busiest rank's compute, rank loads before/after the plan;
//   replica_costs  balance=dynamic priced (issue 31) vs balance-only vs no
//              replicas, every dispatcher, hot experts packed and spread:
//              step time, replicas, forward token bytes, the plan's verdict;
//   fp8        token formats (f32, bf16, fp8 per tensor / per token) and the bf16 wire: bytes, time.
//
// compute_time is modelled (FLOPs at the device's bf16 peak x
// compute_efficiency, memory-bound steps at its HBM bandwidth), so every
// number is a pure function of the configuration: one run per row, no
// repetitions. The first configuration is run twice to show it; a
// configuration two tables share is run once. trace_file=PATH writes the
// trace of the first of those two runs (ring dispatch, the first preset).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <epmoe/moe_layer.h>
#include "balance/routing_skew.h"
#include "bench_args.h"
#include "core/error.h"
#include "core/memory_ledger.h"
#include "core/rng.h"
#include "core/trace_recorder.h"
#include "ep/collective_tags.h"
#include "ep/ep_config.h"
#include "hardware/replica_cost_rates.h"
#include "layer_shape.h"
#include "modelled_hardware.h"

namespace epmoe::bench {

// trace_file=: writes `trace` (FileError naming the path) and says so.
void write_layer_trace(const TraceRecorder& trace, const std::string& path,
                       const std::string& what);  // ep_layer_bench.cc

namespace {

using ep::EpOp;

constexpr std::uint32_t kTagBase = 1 << 20;

struct Case {
  DispatchKind dispatch = DispatchKind::ring;
  bool dedup = false;
  int chunks = 1;
  TokenFormat tokens = TokenFormat::f32;
  WireDType wire = WireDType::f32;  // combine outputs, cotangents, dx
  CotangentAllGather cotangent = CotangentAllGather::ring;
  RematPolicy remat = {};  // save everything (remat_policy=minimal)
  int slots = 0;           // balance=dynamic redundant_slots
  bool skewed = false;     // Zipf routing, hot experts packed on rank 0 (or spread)
  bool spread = false;     // skewed: hot experts spread over the ranks
  bool priced = false;     // balance=dynamic with replica_costs from the hardware
};

struct RankOutcome {
  Picoseconds start = 0;  // of the last step (steps=N runs N; the first N-1 are not timed)
  Picoseconds forward_end = 0, end = 0;
  ModelledTotals totals;
  std::vector<ModelledCollective> collectives;
  DispatchStats dispatch;
  ReplicaStats replicas;
  std::map<std::string, double> phases;  // modelled seconds
  std::int64_t saved_peak_bytes = 0, recomputed_bytes = 0;
};

struct Outcome {
  std::vector<RankOutcome> ranks;
  std::vector<float> y, dx;  // rank 0's

  Picoseconds first_start() const {
    Picoseconds t = kNeverPicoseconds;
    for (const RankOutcome& r : ranks) t = std::min(t, r.start);
    return t;
  }
  Picoseconds step() const {
    Picoseconds t = 0;
    for (const RankOutcome& r : ranks) t = std::max(t, r.end);
    return t - first_start();
  }
  Picoseconds forward() const {
    Picoseconds t = 0;
    for (const RankOutcome& r : ranks) t = std::max(t, r.forward_end);
    return t - first_start();
  }
  Picoseconds backward() const {
    Picoseconds t = 0;
    for (const RankOutcome& r : ranks) t = std::max(t, r.end - r.forward_end);
    return t;
  }
  // The rank that ends last (the others wait on it).
  const RankOutcome& critical() const {
    std::size_t best = 0;
    for (std::size_t r = 1; r < ranks.size(); ++r)
      if (ranks[r].end > ranks[best].end) best = r;
    return ranks[best];
  }
  Picoseconds max_compute() const {
    Picoseconds t = 0;
    for (const RankOutcome& r : ranks) t = std::max(t, r.totals.compute);
    return t;
  }
  double mean_compute() const {
    double t = 0;
    for (const RankOutcome& r : ranks) t += static_cast<double>(r.totals.compute);
    return t / static_cast<double>(ranks.size());
  }
  // Mean over ranks of the bytes sent under keys starting with `prefix`.
  double mean_bytes(const std::string& prefix) const {
    double total = 0;
    for (const RankOutcome& r : ranks)
      for (const auto& [key, bytes] : r.dispatch.bytes_sent)
        if (key.rfind(prefix, 0) == 0) total += static_cast<double>(bytes);
    return total / static_cast<double>(ranks.size());
  }
  double total_bytes(const std::string& prefix) const { return mean_bytes(prefix) * static_cast<double>(ranks.size()); }
  // Duration and exposed time of the dispatcher's collectives of `op`, over
  // ranks and chunks.
  std::pair<Picoseconds, Picoseconds> collective_time(EpOp op) const {
    Picoseconds duration = 0, exposed = 0;
    for (const RankOutcome& r : ranks) {
      for (const ModelledCollective& c : r.collectives) {
        const std::size_t at = c.name.rfind(" tag ");
        if (at == std::string::npos) continue;
        const long long tag = std::stoll(c.name.substr(at + 5));
        if (tag < kTagBase || (tag - kTagBase) % 16 != static_cast<long long>(op)) continue;
        duration += c.duration();
        exposed += c.exposed();
      }
    }
    return {duration, exposed};
  }
  // Rows each rank's experts (home and redundant slots) computed.
  std::vector<std::int64_t> rank_rows() const {
    std::vector<std::int64_t> rows;
    for (const RankOutcome& r : ranks) {
      std::int64_t n = 0;
      for (std::int64_t v : r.dispatch.rows_per_local_expert) n += v;
      for (std::int64_t v : r.replicas.rows_per_slot) n += v;
      rows.push_back(n);
    }
    return rows;
  }
  std::int64_t max_saved_bytes() const {
    std::int64_t b = 0;
    for (const RankOutcome& r : ranks) b = std::max(b, r.saved_peak_bytes);
    return b;
  }
  std::int64_t max_recomputed_bytes() const {
    std::int64_t b = 0;
    for (const RankOutcome& r : ranks) b = std::max(b, r.recomputed_bytes);
    return b;
  }
};

double max_over_mean(const std::vector<std::int64_t>& loads) {
  std::int64_t max_load = 0, total = 0;
  for (std::int64_t v : loads) {
    max_load = std::max(max_load, v);
    total += v;
  }
  return total > 0 ? static_cast<double>(max_load) * static_cast<double>(loads.size()) / static_cast<double>(total)
                   : 1.0;
}

class Runner {
 public:
  Runner(const BenchArgs& args, const LayerShape& shape, const ModelledHardware& hardware)
      : args_(args), shape_(shape), hardware_(hardware) {
    for (const auto placement : {balance::HotExpertPlacement::packed, balance::HotExpertPlacement::spread}) {
      (placement == balance::HotExpertPlacement::packed ? bias_ : spread_bias_) =
          balance::zipf_selection_bias({.num_experts = shape.num_experts,
                                        .num_ranks = shape.num_ranks,
                                        .zipf_exponent = args.number("zipf", 1.2),
                                        .placement = placement,
                                        .scale = args.number("skew_scale", 0.15)});
    }
  }

  // Runs `c` once; the tables share their baselines (ring f32 with one
  // chunk appears in five), so a configuration already run is not run again
  // (deterministic: it would give the same picoseconds).
  const Outcome& run(const Case& c) const {
    const std::string key = describe(c);
    auto it = cache_.find(key);
    if (it == cache_.end()) it = cache_.emplace(key, run_uncached(c)).first;
    return it->second;
  }

  // With `trace`, every rank's phases, compute and collectives are recorded
  // there (modelled microseconds; it does not change a picosecond).
  Outcome run_uncached(const Case& c, TraceRecorder* trace = nullptr) const {
    const LayerShape& s = shape_;
    Outcome outcome;
    outcome.ranks.resize(static_cast<std::size_t>(s.num_ranks));
    std::mutex mutex;
    transport::threads::ThreadsOptions threads = hardware_.threads;
    threads.trace = trace;
    transport::threads::run_ranks(s.num_ranks, threads, [&](transport::Communicator& comm) {
      Rng rng = rank_rng(comm.rank());
      const int el = s.num_experts / s.num_ranks;
      Tensor gate = replicated_gate(s.hidden, s.num_experts);
      Tensor x = random_tensor({s.tokens, s.hidden}, rng, 1.0), dy = random_tensor({s.tokens, s.hidden}, rng, 1.0);
      Tensor wi0 = random_tensor({el, s.hidden, s.ffn}, rng, 1.0 / std::sqrt(double(s.hidden)));
      Tensor wi1 = random_tensor({el, s.hidden, s.ffn}, rng, 1.0 / std::sqrt(double(s.hidden)));
      Tensor wo = random_tensor({el, s.ffn, s.hidden}, rng, 1.0 / std::sqrt(double(s.ffn)));
      Tensor bias(DType::f32, {s.num_experts});
      const std::vector<float>& chosen_bias = c.spread ? spread_bias_ : bias_;
      for (int e = 0; e < s.num_experts; ++e) bias.data<float>()[e] = chosen_bias[static_cast<std::size_t>(e)];
      EpConfig config{.num_experts = s.num_experts,
                      .top_k = s.top_k,
                      .hidden = s.hidden,
                      .num_chunks = c.chunks,
                      .dedup = c.dedup,
                      .token_format = c.tokens,
                      .wire_dtype = c.wire,
                      .cotangent_all_gather = c.cotangent,
                      .tag_base = kTagBase};
      config.balance = c.slots > 0 ? BalanceMode::dynamic : BalanceMode::off;
      config.redundant_slots = c.slots;
      config.rebalance_threshold = args_.number("rebalance_threshold", 1.05);
      if (c.priced) {
        config.replica_costs = hardware::replica_cost_rates(hardware_.threads.modelled, hardware_.threads.links,
                                                            hardware_.threads.compute_threads_per_rank);
      }
      MemoryLedger ledger;
      EpConfig group_config = config;
      group_config.dispatch = c.dispatch;
      EpGroup group(comm, group_config, &ledger);
      MoeLayer layer({.hidden = s.hidden,
                      .ffn = s.ffn,
                      .router = {.kind = c.skewed ? RouterKind::sigmoid_grouped : RouterKind::softmax_topk,
                                 .num_experts = s.num_experts,
                                 .top_k = s.top_k},
                      .remat = c.remat},
                     group, &ledger);
      const MoeWeights weights{gate, wi0, wi1, wo, c.skewed ? bias.view() : TensorView()};
      ModelledClock& clock = *this_thread_modelled_clock();
      RankOutcome mine;
      // steps=N: the last of N steps is timed (a training step's steady
      // state: weights change every step, priced plans skip what does not pay).
      const int num_steps = static_cast<int>(args_.number("steps", 1));
      for (int step = 1; step < num_steps; ++step) {
        layer.forward(x, weights);
        layer.backward(dy);
      }
      mine.start = clock.now();
      const Tensor y = layer.forward(x, weights).y;
      mine.forward_end = clock.now();
      const MoeGradients grads = layer.backward(dy);
      mine.end = clock.now();
      mine.totals = clock.totals();
      mine.collectives = clock.collectives(0);
      mine.dispatch = layer.last_step_stats().dispatch;
      mine.replicas = layer.last_step_stats().replicas;
      mine.phases = layer.stats().phase_seconds;
      mine.saved_peak_bytes = layer.stats().saved_activation_peak_bytes;
      mine.recomputed_bytes = layer.stats().recomputed_bytes;
      std::lock_guard<std::mutex> lock(mutex);
      outcome.ranks[static_cast<std::size_t>(comm.rank())] = std::move(mine);
      if (comm.rank() == 0) {
        outcome.y.assign(y.span<float>().begin(), y.span<float>().end());
        outcome.dx.assign(grads.dx.span<float>().begin(), grads.dx.span<float>().end());
      }
    });
    return outcome;
  }

 private:
  static std::string describe(const Case& c) {
    return to_string(c.dispatch) + (c.dedup ? " dedup" : "") + " chunks=" + std::to_string(c.chunks) + " " +
           to_string(c.tokens) + (c.wire == WireDType::bf16 ? " wire=bf16" : "") +
           (c.cotangent == CotangentAllGather::plain ? " plain" : " ring") + " " + c.remat.describe() +
           " slots=" + std::to_string(c.slots) + (c.skewed ? " skewed" : "") + (c.spread ? " spread" : "") +
           (c.priced ? " priced" : "");
  }

  const BenchArgs& args_;
  LayerShape shape_;
  const ModelledHardware& hardware_;
  std::vector<float> bias_, spread_bias_;  // Zipf selection bias, hot experts packed / spread
  mutable std::map<std::string, Outcome> cache_;
};

// Same y and dx (f32 round-off: 1e-5 of the largest) as the reference.
void verify_same(const BenchArgs& args, const std::string& what, const Outcome& reference, const Outcome& outcome) {
  if (!args.verify()) return;
  auto check = [&](const std::vector<float>& a, const std::vector<float>& b, const char* name) {
    double max_diff = 0, max_ref = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      max_diff = std::max(max_diff, double(std::abs(a[i] - b[i])));
      max_ref = std::max(max_ref, double(std::abs(a[i])));
    }
    if (a.size() != b.size() || max_diff > 1e-5 * max_ref)
      throw InternalError("bench layer clock=modelled: " + what + ": " + name + " disagrees with the reference by " +
                          std::to_string(max_diff));
  };
  check(reference.y, outcome.y, "y");
  check(reference.dx, outcome.dx, "dx");
}

double us(Picoseconds t) { return to_us(t); }
double mb(double bytes) { return bytes / 1e6; }

RematPolicy remat(bool x_sorted, bool mlpwi_0, bool mlpwi_1, bool mlpwo) {
  return {.save_x_sorted = x_sorted, .save_mlpwi_0 = mlpwi_0, .save_mlpwi_1 = mlpwi_1, .save_mlpwo = mlpwo};
}

void cotangent_table(const BenchArgs& args, const Runner& runner) {
  std::printf(
      "\n**cotangent_all_gather** (ring dispatch): ring = async, started a chunk ahead; plain = "
      "blocking where needed. hidden = 1 - exposed / duration of the cotangent all-gathers (all ranks, "
      "all chunks)\n\n");
  std::printf(
      "| chunks | remat_policy | cotangent | step us | backward us | cotangent all-gather us/rank | "
      "exposed us/rank | hidden | backward plain / this |\n|---|---|---|---|---|---|---|---|---|\n");
  struct Row {
    int chunks;
    const char* policy;
  };
  for (const Row row : {Row{1, "minimal"}, Row{4, "minimal"}, Row{1, "full"}, Row{4, "full"}}) {
    Outcome outcomes[2];
    for (int i = 0; i < 2; ++i) {
      Case c{.chunks = row.chunks,
             .cotangent = i == 0 ? CotangentAllGather::plain : CotangentAllGather::ring,
             .remat = RematPolicy::preset("remat_policy", row.policy)};
      outcomes[i] = runner.run(c);
    }
    verify_same(args, "cotangent_all_gather=ring", outcomes[0], outcomes[1]);
    const double ranks = static_cast<double>(outcomes[0].ranks.size());
    for (int i : {1, 0}) {
      const Outcome& o = outcomes[i];
      const auto [duration, exposed] = o.collective_time(EpOp::backward_cotangent);
      std::printf("| %d | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", row.chunks, row.policy,
                  i == 1 ? "ring" : "plain", us(o.step()), us(o.backward()), us(duration) / ranks, us(exposed) / ranks,
                  duration > 0 ? 1.0 - double(exposed) / double(duration) : 1.0,
                  double(outcomes[0].backward()) / double(o.backward()));
    }
  }
}

// Seconds of the phases whose names start with one of `prefixes`.
double phase_sum(const RankOutcome& r, std::initializer_list<const char*> prefixes) {
  double t = 0;
  for (const auto& [name, seconds] : r.phases)
    for (const char* p : prefixes)
      if (name.rfind(p, 0) == 0) t += seconds;
  return t;
}

void chunks_table(const BenchArgs& args, const Runner& runner) {
  std::printf(
      "\n**token_chunks** vs the pipeline formula T(n) = T(1) - L - X + max(L, X) + min(L, X) / n per "
      "pass (L: the pass's communication phases, X: its expert compute, both at n = 1 on the critical "
      "rank; per-chunk latency and launch costs are not in it)\n\n");
  std::printf(
      "| dispatch | chunks | forward us | formula | backward us | formula | step us | formula | "
      "step(1) / step(n) | L fwd us | X fwd us |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const DispatchKind dispatch : {DispatchKind::ring, DispatchKind::alltoall}) {
    double lf = 0, xf = 0, lb = 0, xb = 0, tf = 0, tb = 0;
    Outcome first;
    for (const int n : {1, 2, 4}) {
      const Outcome& o = runner.run({.dispatch = dispatch, .chunks = n});
      if (n == 1) {
        const RankOutcome& r = o.critical();
        lf = phase_sum(r, {"dispatch", "combine"});
        xf = phase_sum(r, {"experts"});
        lb = phase_sum(r, {"backward_combine", "backward_dispatch"});
        xb = phase_sum(r, {"backward_experts", "backward_remat"});
        tf = to_seconds(o.forward());
        tb = to_seconds(o.backward());
        first = o;
      } else {
        verify_same(args, "token_chunks=" + std::to_string(n), first, o);
      }
      const double pf = tf - lf - xf + std::max(lf, xf) + std::min(lf, xf) / n;
      const double pb = tb - lb - xb + std::max(lb, xb) + std::min(lb, xb) / n;
      std::printf("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
                  to_string(dispatch).c_str(), n, us(o.forward()), pf * 1e6, us(o.backward()), pb * 1e6, us(o.step()),
                  (pf + pb) * 1e6, (tf + tb) / to_seconds(o.step()), lf * 1e6, xf * 1e6);
    }
  }
}

void remat_table(const BenchArgs& args, const Runner& runner) {
  std::printf(
      "\n**remat**: what backward finds saved. saved MB: the layer's MemoryLedger peak of "
      "saved activations (largest rank); backward MB sent: per rank; recomputed MB: largest rank\n\n");
  std::printf(
      "| dispatch | policy | saved MB | saved / minimal | backward us | backward / minimal | "
      "backward MB sent | recomputed MB |\n|---|---|---|---|---|---|---|---|\n");
  struct Policy {
    const char* name;
    RematPolicy policy;
  };
  const std::vector<Policy> policies = {
      {"x_sorted=save (minimal)", remat(true, true, true, true)},
      {"x_sorted=remat", remat(false, true, true, true)},
      {"save_dispatch", remat(true, false, false, false)},
      {"full", remat(false, false, false, false)},
  };
  for (const DispatchKind dispatch : {DispatchKind::ring, DispatchKind::alltoall}) {
    Outcome base;
    for (std::size_t i = 0; i < policies.size(); ++i) {
      const Outcome& o = runner.run({.dispatch = dispatch, .remat = policies[i].policy});
      if (i == 0)
        base = o;
      else
        verify_same(args, policies[i].name, base, o);
      std::printf("| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", to_string(dispatch).c_str(),
                  policies[i].name, mb(double(o.max_saved_bytes())),
                  double(o.max_saved_bytes()) / double(base.max_saved_bytes()), us(o.backward()),
                  double(o.backward()) / double(base.backward()), mb(o.mean_bytes("backward")),
                  mb(double(o.max_recomputed_bytes())));
    }
  }
}

void dedup_table(const BenchArgs& args, const Runner& runner, const LayerShape& s) {
  const double row = double(s.hidden) * 4;
  const int el = s.num_experts / s.num_ranks;
  const double p_hit = hit_probability(s.num_experts, el, s.top_k);
  std::printf(
      "\n**dedup** (alltoall): forward token bytes per rank against DESIGN.md §4.6 (uniform routing): "
      "all-to-all K·N_l·H·4·(R-1)/R, dedup N_l·H·4·(R-1)·P(hit), P(hit) = %.3f; ring (R-1)·N_l·H·4\n\n",
      p_hit);
  std::printf(
      "| variant | fwd token MB/rank | analytic MB | MB sent/rank, all | forward us | backward us | step us | "
      "step vs alltoall |\n|---|---|---|---|---|---|---|---|\n");
  struct Row {
    const char* name;
    Case c;
    double analytic;
  };
  const std::vector<Row> rows = {
      {"alltoall", {.dispatch = DispatchKind::alltoall}, s.top_k * s.tokens * row * (s.num_ranks - 1) / s.num_ranks},
      {"alltoall dedup",
       {.dispatch = DispatchKind::alltoall, .dedup = true},
       s.tokens * row * (s.num_ranks - 1) * p_hit},
      {"ring", {.dispatch = DispatchKind::ring}, double(s.num_ranks - 1) * s.tokens * row},
  };
  Outcome base;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Outcome& o = runner.run(rows[i].c);
    if (i == 0)
      base = o;
    else
      verify_same(args, rows[i].name, base, o);
    const std::string key =
        rows[i].c.dispatch == DispatchKind::ring ? "forward/ring_all_gather tokens" : "forward/all_to_all_v tokens";
    std::printf("| %s | %.3f | %.3f | %.3f | %.2f | %.2f | %.2f | %.2f |\n", rows[i].name, mb(o.mean_bytes(key)),
                mb(rows[i].analytic), mb(o.mean_bytes("")), us(o.forward()), us(o.backward()), us(o.step()),
                double(base.step()) / double(o.step()));
  }
}

void replicas_table(const BenchArgs& args, const Runner& runner, const LayerShape& s) {
  std::printf(
      "\n**replicas** (balance=dynamic) under packed Zipf routing (sigmoid_grouped, selection bias Zipf "
      "s=%.2f scale %.2f, hot experts on rank 0). busiest compute: the largest rank's modelled compute; "
      "rows max/mean: rows per rank over the mean; weights+grads MB: replica weights out and gradients "
      "home, all ranks, per step\n\n",
      args.number("zipf", 1.2), args.number("skew_scale", 0.15));
  std::printf(
      "| dispatch | B | step us | speed-up | busiest compute us | mean compute us | rows max/mean | "
      "replicas | weights+grads MB |\n|---|---|---|---|---|---|---|---|---|\n");
  std::vector<int> slots = {0};
  for (int b : args.ints("slots", "1,2")) slots.push_back(b);
  for (const DispatchKind dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
    Outcome base;
    for (const int b : slots) {
      const Outcome& o = runner.run({.dispatch = dispatch, .slots = b, .skewed = true});
      if (b == 0)
        base = o;
      else
        verify_same(args, "redundant_slots=" + std::to_string(b), base, o);
      std::printf("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.3f | %d | %.2f |\n", to_string(dispatch).c_str(), b,
                  us(o.step()), double(base.step()) / double(o.step()), us(o.max_compute()), o.mean_compute() * 1e-6,
                  max_over_mean(o.rank_rows()), o.ranks[0].replicas.num_replicas,
                  mb(o.total_bytes("forward/replica weights") + o.total_bytes("backward/replica gradients")));
    }
  }
  (void)s;
}

// Issue 31: the cost-aware plan (replica_costs=priced, the default of
// `epmoe layer`) against the balance-only plan and no replicas, for every
// dispatcher, hot experts packed and spread, B = 1, 2.
void replica_costs_table(const BenchArgs& args, const Runner& runner) {
  std::printf(
      "\n**replica costs** (balance=dynamic rebalance_threshold=%.2f) under Zipf routing (s=%.2f scale %.2f), "
      "hot experts packed on rank 0 or spread. step: off = no replicas; balance = the plan that balances "
      "whatever it costs (replica_costs=off); priced = the cost-aware plan (replica_costs=priced). "
      "fwd token MB: forward token bytes per rank after dedup. predicted: the priced plan's saving / cost "
      "(rank 0's plan), refused: replicas of the balance plan it did not place\n\n",
      args.number("rebalance_threshold", 1.05), args.number("zipf", 1.2), args.number("skew_scale", 0.15));
  std::printf(
      "| dispatch | hot | B | step off us | balance us | x off | priced us | x off | replicas balance / priced | "
      "fwd token MB off / balance / priced | predicted save / cost us | refused |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  struct Row {
    DispatchKind dispatch;
    bool dedup;
    const char* name;
  };
  for (const Row row : {Row{DispatchKind::alltoall, false, "alltoall"},
                        Row{DispatchKind::alltoall, true, "alltoall dedup"}, Row{DispatchKind::ring, false, "ring"}}) {
    const std::string key =
        row.dispatch == DispatchKind::ring ? "forward/ring_all_gather tokens" : "forward/all_to_all_v tokens";
    for (const bool spread : {false, true}) {
      const Case off_case{.dispatch = row.dispatch, .dedup = row.dedup, .skewed = true, .spread = spread};
      const Outcome& off = runner.run(off_case);
      for (const int b : args.ints("slots", "1,2")) {
        Case balance_case = off_case, priced_case = off_case;
        balance_case.slots = priced_case.slots = b;
        priced_case.priced = true;
        const Outcome& balance = runner.run(balance_case);
        const Outcome& priced = runner.run(priced_case);
        verify_same(args, std::string(row.name) + " balance", off, balance);
        verify_same(args, std::string(row.name) + " priced", off, priced);
        const ReplicaStats& plan = priced.ranks[0].replicas;
        std::printf(
            "| %s | %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %d / %d | %.3f / %.3f / %.3f | %.2f / %.2f | %d |\n",
            row.name, spread ? "spread" : "packed", b, us(off.step()), us(balance.step()),
            double(off.step()) / double(balance.step()), us(priced.step()), double(off.step()) / double(priced.step()),
            balance.ranks[0].replicas.num_replicas, plan.num_replicas, mb(off.mean_bytes(key)),
            mb(balance.mean_bytes(key)), mb(priced.mean_bytes(key)), plan.predicted_saving_seconds * 1e6,
            plan.predicted_cost_seconds * 1e6, plan.refused_replicas);
        std::fflush(stdout);
      }
    }
  }
}

void fp8_table(const BenchArgs& args, const Runner& runner) {
  (void)args;
  std::printf(
      "\n**token and wire formats**: forward token bytes and step time per format. Tokens f32, bf16 (the "
      "accelerators' transfer format), fp8 per tensor or per token (one f32 scale per row); wire = the "
      "combine outputs, cotangents and dx (f32, or bf16 as the seed's bf16 system sends them). fp8's gain is "
      "read against bf16 tokens on a bf16 wire, the seed's baseline\n\n");
  std::printf(
      "| dispatch | tokens | wire | fwd token MB/rank | vs f32 | forward us | step us | step f32 / this | "
      "step bf16 / this |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  struct Row {
    DispatchKind dispatch;
    bool dedup;
    const char* name;
  };
  struct Format {
    TokenFormat tokens;
    WireDType wire;
  };
  constexpr Format kFormats[] = {{TokenFormat::f32, WireDType::f32},        {TokenFormat::bf16, WireDType::bf16},
                                 {TokenFormat::fp8_tensor, WireDType::f32}, {TokenFormat::fp8_tensor, WireDType::bf16},
                                 {TokenFormat::fp8_token, WireDType::f32},  {TokenFormat::fp8_token, WireDType::bf16}};
  for (const Row row : {Row{DispatchKind::ring, false, "ring"}, Row{DispatchKind::alltoall, true, "alltoall dedup"}}) {
    const std::string key =
        row.dispatch == DispatchKind::ring ? "forward/ring_all_gather tokens" : "forward/all_to_all_v tokens";
    const Outcome& f32 = runner.run({.dispatch = row.dispatch, .dedup = row.dedup});
    const Outcome& bf16 = runner.run(
        {.dispatch = row.dispatch, .dedup = row.dedup, .tokens = TokenFormat::bf16, .wire = WireDType::bf16});
    for (const Format format : kFormats) {
      const Outcome& o =
          runner.run({.dispatch = row.dispatch, .dedup = row.dedup, .tokens = format.tokens, .wire = format.wire});
      std::printf("| %s | %s | %s | %.3f | %.3f | %.2f | %.2f | %.2f | %.2f |\n", row.name,
                  format.tokens == TokenFormat::f32 ? "f32" : to_string(format.tokens).c_str(),
                  to_string(format.wire).c_str(), mb(o.mean_bytes(key)), o.mean_bytes(key) / f32.mean_bytes(key),
                  us(o.forward()), us(o.step()), double(f32.step()) / double(o.step()),
                  double(bf16.step()) / double(o.step()));
      std::fflush(stdout);
    }
  }
}

const std::vector<std::string>& table_names() {
  static const std::vector<std::string> names = {"cotangent", "chunks",        "remat", "dedup",
                                                 "replicas",  "replica_costs", "fp8"};
  return names;
}

}  // namespace

int run_modelled_layer_bench(const BenchArgs& args) {
  const LayerShape shape = shape_from(args, 8);
  std::set<std::string> tables;
  if (args.part == "remat" || args.part == "replicas") {
    tables.insert(args.part);
  } else {
    const auto it = args.values.find("tables");
    const std::string list = it == args.values.end() ? "all" : it->second;
    std::stringstream stream(list);
    std::string item;
    while (std::getline(stream, item, ',')) {
      if (item == "all")
        tables.insert(table_names().begin(), table_names().end());
      else if (std::find(table_names().begin(), table_names().end(), item) != table_names().end())
        tables.insert(item);
      else
        throw ConfigError("tables=" + list + ": unknown table '" + item + "'");
    }
  }
  const double latency_us = args.number("link_latency_us", 2.0);
  const auto trace_it = args.values.find("trace_file");
  const std::string trace_file = trace_it == args.values.end() ? "" : trace_it->second;
  std::printf(
      "EP layer fwd+bwd, clock=modelled, compute_time=modelled (compute_efficiency %.2f): R=%d ranks as "
      "threads, N_l=%lld tokens per rank, H=%lld F=%lld E=%d K=%d, f32 tokens unless stated. Every number "
      "is a pure function of the configuration (one run per row, no repetitions; the host CPU does not "
      "enter). Times: the slowest rank's modelled microseconds.\n",
      args.number("compute_efficiency", 0.5), shape.num_ranks, (long long)shape.tokens, (long long)shape.hidden,
      (long long)shape.ffn, shape.num_experts, shape.top_k);
  bool checked = false;
  for (const std::string& name : hardware_names(args)) {
    const ModelledHardware hardware = modelled_hardware(name, shape.num_ranks, latency_us, args);
    const Runner runner(args, shape, hardware);
    std::printf("\n### %s: links %s; %.0f TFLOP/s bf16 x %.2f, %.0f GB/s HBM\n", hardware.name.c_str(),
                describe_links(hardware.threads.links).c_str(), hardware.peak_flops / 1e12,
                hardware.threads.modelled.compute_efficiency, hardware.threads.modelled.memory_bytes_per_s / 1e9);
    if (!checked) {
      // Determinism: the same configuration twice gives the same picoseconds
      // (the first run traced with trace_file=, so tracing is checked not to
      // move them either).
      std::optional<TraceRecorder> trace;
      if (!trace_file.empty()) trace.emplace();
      const Outcome a = runner.run_uncached({}, trace ? &*trace : nullptr), b = runner.run_uncached({});
      if (a.step() != b.step() || a.forward() != b.forward())
        throw InternalError("bench layer clock=modelled: two runs of one configuration differ: " +
                            std::to_string(a.step()) + " vs " + std::to_string(b.step()) + " ps");
      std::printf("(determinism: ring dispatch run twice, step %lld ps both times)\n", (long long)a.step());
      if (trace) write_layer_trace(*trace, trace_file, "the first of those runs, " + hardware.name);
      checked = true;
    }
    if (tables.count("cotangent")) cotangent_table(args, runner);
    if (tables.count("chunks")) chunks_table(args, runner);
    if (tables.count("remat")) remat_table(args, runner);
    if (tables.count("dedup")) dedup_table(args, runner, shape);
    if (tables.count("replicas")) replicas_table(args, runner, shape);
    if (tables.count("replica_costs")) replica_costs_table(args, runner);
    if (tables.count("fp8")) fp8_table(args, runner);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace epmoe::bench
