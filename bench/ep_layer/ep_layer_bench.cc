// Expert-parallel MoE layer, forward + backward, per dispatcher, with ranks as
// threads on emulated links (transport/threads/emulated_links.h): a
// DeepSeek-like routing shape (E/K = 8, K = 8) scaled to this 2-core
// machine. For each variant: median time, bytes sent per rank per collective
// against the analytic formulas of DESIGN.md §4.6, and the speed-up of
// token chunks and fp8 tokens.
//
//   bench_ep_layer [ranks=4 tokens_per_rank=256 hidden=256 ffn=128 experts=64
//                   top_k=8 link_gbps=0.5 link_latency_us=5 topology=full_mesh
//                   min_seconds=1 verify=1]
//   bench_ep_layer remat [same keys; dispatch=ring|alltoall]
//     per remat policy and at two per-rank batch sizes (tokens_per_rank and
//     4x it): peak saved bytes per rank, backward time, backward bytes sent.
//   bench_ep_layer replicas [same keys; zipf=1.2 skew_scale=0.15 slots=1,2]
//     dynamic redundant experts (balance=dynamic) under Zipf-skewed routing
//     (sigmoid_grouped selection bias, balance/routing_skew.h), hot experts
//     spread over ranks and packed on rank 0, per dispatcher: fwd+bwd median
//     with B = 0 (off) and each B of `slots`, max/mean rank load before and
//     after the plan, replicas placed, and the weight bytes moved per step
//     (replica weights forward + replica gradients backward, all ranks; the
//     weight version changes every step, as in training).
//
// trace_file=PATH (every part, both clocks): a Chrome trace (Perfetto UI) of
// one forward + backward of the bench's first configuration, recorded with
// the TraceRecorder of `epmoe layer trace_file=` (core/trace_recorder.h).
// On the wall clock that is one extra, untimed run before the timed ones (on
// the same emulated links): the default bench's alltoall variant, remat's
// first policy (minimal, N_l = tokens_per_rank), replicas' spread alltoall
// with B = 0. On the modelled clock, the first run of its determinism check.
#include "ep_layer_bench.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <epmoe/moe_layer.h>
#include "balance/routing_skew.h"
#include "bench_args.h"
#include "comm/barrier.h"
#include "core/error.h"
#include "core/memory_ledger.h"
#include "core/rng.h"
#include "core/timer.h"
#include "core/trace_recorder.h"
#include "ep/ep_config.h"
#include "layer_shape.h"
#include "modelled_hardware.h"
#include "transport/threads/launcher.h"

namespace epmoe::bench {

int run_modelled_layer_bench(const BenchArgs& args);  // modelled_layer_bench.cc

void write_layer_trace(const TraceRecorder& trace, const std::string& path, const std::string& what) {
  trace.write(path);  // FileError naming the path
  std::printf("trace: %s (%zu events: one forward + backward, %s; open in https://ui.perfetto.dev)\n", path.c_str(),
              trace.num_events(), what.c_str());
  std::fflush(stdout);
}

namespace {

struct Variant {
  std::string name;
  DispatchKind dispatch;
  bool dedup = false;
  int chunks = 1;
  TokenFormat tokens = TokenFormat::f32;
};

struct Result {
  Timing timing;
  std::map<std::string, std::int64_t> bytes_sent;  // rank 0
  std::vector<float> y_sample;                     // rank 0's y, for cross-variant verification
};

transport::threads::ThreadsOptions links_from(const BenchArgs& args) {
  transport::threads::ThreadsOptions threads;
  threads.links.enabled = args.number("link_gbps", 0.5) > 0;
  // link_gbps=0: no emulation (the options keep their default rate, which
  // validation wants > 0 even when disabled).
  if (threads.links.enabled) threads.links.bandwidth_gb_per_s = args.number("link_gbps", 0.5);
  threads.links.latency_us = args.number("link_latency_us", 5);
  threads.links.topology = args.values.count("topology") && args.values.at("topology") == "ring"
                               ? transport::threads::LinkTopology::ring
                               : transport::threads::LinkTopology::full_mesh;
  return threads;
}

std::string trace_file(const BenchArgs& args) {
  const auto it = args.values.find("trace_file");
  return it == args.values.end() ? "" : it->second;
}

// The bench's first configuration, for trace_file= on the wall clock.
struct TracedConfig {
  std::string name;
  DispatchKind dispatch = DispatchKind::alltoall;
  std::int64_t tokens = 0;                   // per rank
  RematPolicy remat = {};                    // remat_policy=minimal
  const std::vector<float>* bias = nullptr;  // sigmoid_grouped routing with this selection bias
};

// trace_file=PATH on the wall clock: one untimed forward + backward of
// `config` on the bench's links, traced, then written (before the timed runs,
// so an unwritable path fails at once).
void trace_first_configuration(const BenchArgs& args, const LayerShape& shape,
                               transport::threads::ThreadsOptions threads, const TracedConfig& config) {
  const std::string path = trace_file(args);
  if (path.empty()) return;
  TraceRecorder trace;
  threads.trace = &trace;
  transport::threads::run_ranks(shape.num_ranks, threads, [&](transport::Communicator& comm) {
    Rng rng = rank_rng(comm.rank());
    const int el = shape.num_experts / shape.num_ranks;
    Tensor gate = replicated_gate(shape.hidden, shape.num_experts);
    Tensor x = random_tensor({config.tokens, shape.hidden}, rng, 1.0);
    Tensor dy = random_tensor({config.tokens, shape.hidden}, rng, 1.0);
    Tensor wi0 = random_tensor({el, shape.hidden, shape.ffn}, rng, 1.0 / std::sqrt(double(shape.hidden)));
    Tensor wi1 = random_tensor({el, shape.hidden, shape.ffn}, rng, 1.0 / std::sqrt(double(shape.hidden)));
    Tensor wo = random_tensor({el, shape.ffn, shape.hidden}, rng, 1.0 / std::sqrt(double(shape.ffn)));
    Tensor bias(DType::f32, {shape.num_experts});
    if (config.bias)
      for (int e = 0; e < shape.num_experts; ++e) bias.data<float>()[e] = (*config.bias)[static_cast<std::size_t>(e)];
    EpConfig ep_config{
        .num_experts = shape.num_experts, .top_k = shape.top_k, .hidden = shape.hidden, .tag_base = 1 << 20};
    EpConfig group_config = ep_config;
    group_config.dispatch = config.dispatch;
    EpGroup group(comm, group_config);
    MoeLayer layer({.hidden = shape.hidden,
                    .ffn = shape.ffn,
                    .router = {.kind = config.bias ? RouterKind::sigmoid_grouped : RouterKind::softmax_topk,
                               .num_experts = shape.num_experts,
                               .top_k = shape.top_k},
                    .remat = config.remat},
                   group);
    layer.forward(x, {gate, wi0, wi1, wo, config.bias ? bias.view() : TensorView()});
    layer.backward(dy);
  });
  write_layer_trace(trace, path, config.name + ", wall clock, untimed");
}

// The remat trade: per policy and batch size, what backward keeps, how long
// it takes and what it sends.
int run_remat_bench(const BenchArgs& args) {
  const LayerShape base = shape_from(args, 4);
  const transport::threads::ThreadsOptions threads = links_from(args);
  const bool ring = !args.values.count("dispatch") || args.values.at("dispatch") == "ring";
  const int repetitions = static_cast<int>(args.number("repetitions", 5));
  std::printf(
      "remat policies, %s dispatch, R=%d, H=%lld F=%lld E=%d K=%d, links %.2f GB/s; "
      "backward median of %d (rank 0)\n",
      ring ? "ring" : "alltoall", base.num_ranks, (long long)base.hidden, (long long)base.ffn, base.num_experts,
      base.top_k, threads.links.enabled ? threads.links.bandwidth_gb_per_s : 0.0, repetitions);
  trace_first_configuration(args, base, threads,
                            {.name = std::string(ring ? "ring" : "alltoall") + " remat_policy=minimal",
                             .dispatch = ring ? DispatchKind::ring : DispatchKind::alltoall,
                             .tokens = base.tokens,
                             .remat = RematPolicy::preset("remat_policy", "minimal")});
  std::printf("%-8s %-14s %16s %14s %16s %18s\n", "N_l", "policy", "saved peak MB", "backward ms", "backward MB sent",
              "recomputed MB");
  for (const std::int64_t tokens : {base.tokens, 4 * base.tokens}) {
    for (const char* policy : {"minimal", "save_dispatch", "full"}) {
      double backward_ms = 0, backward_mb = 0, saved_mb = 0, recomputed_mb = 0;
      transport::threads::run_ranks(base.num_ranks, threads, [&](transport::Communicator& comm) {
        Rng rng = rank_rng(comm.rank());
        const int el = base.num_experts / base.num_ranks;
        Tensor gate = replicated_gate(base.hidden, base.num_experts);
        Tensor x = random_tensor({tokens, base.hidden}, rng, 1.0), dy = random_tensor({tokens, base.hidden}, rng, 1.0);
        Tensor wi0 = random_tensor({el, base.hidden, base.ffn}, rng, 1.0 / std::sqrt(double(base.hidden)));
        Tensor wi1 = random_tensor({el, base.hidden, base.ffn}, rng, 1.0 / std::sqrt(double(base.hidden)));
        Tensor wo = random_tensor({el, base.ffn, base.hidden}, rng, 1.0 / std::sqrt(double(base.ffn)));
        EpConfig config{
            .num_experts = base.num_experts, .top_k = base.top_k, .hidden = base.hidden, .tag_base = 1 << 20};
        MemoryLedger ledger;
        EpConfig group_config = config;
        group_config.dispatch = ring ? DispatchKind::ring : DispatchKind::alltoall;
        EpGroup group(comm, group_config, &ledger);
        MoeLayer layer({.hidden = base.hidden,
                        .ffn = base.ffn,
                        .router = {.num_experts = base.num_experts, .top_k = base.top_k},
                        .remat = RematPolicy::preset("remat_policy", policy)},
                       group, &ledger);
        const MoeWeights weights{gate, wi0, wi1, wo, {}};
        std::vector<double> seconds;
        for (int i = 0; i <= repetitions; ++i) {  // i = 0 warms up
          layer.forward(x, weights);
          comm::barrier(comm, {.tag = 900}).wait();
          Stopwatch watch;
          layer.backward(dy);
          if (i > 0) seconds.push_back(watch.elapsed_seconds());
        }
        if (comm.rank() == 0) {
          backward_ms = summarise(seconds).median_s * 1e3;
          std::int64_t sent = 0;
          for (const auto& [name, bytes] : layer.last_step_stats().dispatch.bytes_sent)
            if (name.rfind("backward", 0) == 0) sent += bytes;
          backward_mb = sent / 1e6;
          saved_mb = layer.stats().saved_activation_peak_bytes / 1e6;
          recomputed_mb = layer.stats().recomputed_bytes / 1e6;
        }
      });
      std::printf("%-8lld %-14s %16.2f %14.2f %16.2f %18.2f\n", (long long)tokens, policy, saved_mb, backward_ms,
                  backward_mb, recomputed_mb);
    }
  }
  return 0;
}

// Dynamic replicas under Zipf skew: time and weight bytes moved, B = 0 vs B > 0.
int run_replicas_bench(const BenchArgs& args) {
  const LayerShape shape = shape_from(args, 4);
  const transport::threads::ThreadsOptions threads = links_from(args);
  TimingOptions timing = args.timing();
  timing.min_seconds = args.number("min_seconds", 1.0);
  const double zipf = args.number("zipf", 1.2), skew_scale = args.number("skew_scale", 0.15);
  std::vector<int> slot_counts = {0};
  {
    const std::string list = args.values.count("slots") ? args.values.at("slots") : "1,2";
    std::size_t at = 0;
    while (at < list.size()) {
      const std::size_t comma = list.find(',', at);
      slot_counts.push_back(std::stoi(list.substr(at, comma - at)));
      at = comma == std::string::npos ? list.size() : comma + 1;
    }
  }
  const std::int64_t expert_bytes = 3 * shape.hidden * shape.ffn * 4;
  std::printf(
      "dynamic replicas, EP layer fwd+bwd: R=%d N_l=%lld H=%lld F=%lld E=%d K=%d, sigmoid_grouped "
      "routing with Zipf s=%.2f selection bias (scale %.2f); links %.2f GB/s %.0f us; one expert's "
      "weights = %.2f MB\n",
      shape.num_ranks, (long long)shape.tokens, (long long)shape.hidden, (long long)shape.ffn, shape.num_experts,
      shape.top_k, zipf, skew_scale, threads.links.enabled ? threads.links.bandwidth_gb_per_s : 0.0,
      threads.links.latency_us, expert_bytes / 1e6);
  {
    const std::vector<float> spread = balance::zipf_selection_bias({.num_experts = shape.num_experts,
                                                                    .num_ranks = shape.num_ranks,
                                                                    .zipf_exponent = zipf,
                                                                    .placement = balance::HotExpertPlacement::spread,
                                                                    .scale = skew_scale});
    trace_first_configuration(
        args, shape, threads,
        {.name = "spread alltoall B=0", .dispatch = DispatchKind::alltoall, .tokens = shape.tokens, .bias = &spread});
  }
  std::printf("%-8s %-9s %3s %10s %8s %9s %9s %9s %14s %14s %9s\n", "hot", "dispatch", "B", "median ms", "speedup",
              "max/mean", "after", "replicas", "weights MB/st", "grads MB/step", "plan us");
  for (const auto placement : {balance::HotExpertPlacement::spread, balance::HotExpertPlacement::packed}) {
    const std::vector<float> bias_values = balance::zipf_selection_bias({.num_experts = shape.num_experts,
                                                                         .num_ranks = shape.num_ranks,
                                                                         .zipf_exponent = zipf,
                                                                         .placement = placement,
                                                                         .scale = skew_scale});
    for (const auto dispatch : {DispatchKind::alltoall, DispatchKind::ring}) {
      double off_median = 0;
      std::vector<float> y_off;
      for (const int slots : slot_counts) {
        Timing result_timing;
        std::vector<DispatchStats> stats(static_cast<std::size_t>(shape.num_ranks));
        std::vector<ReplicaStats> replica_stats(static_cast<std::size_t>(shape.num_ranks));
        std::vector<float> y_sample;
        transport::threads::run_ranks(shape.num_ranks, threads, [&](transport::Communicator& comm) {
          Rng rng = rank_rng(comm.rank());
          const int el = shape.num_experts / shape.num_ranks;
          Tensor gate = replicated_gate(shape.hidden, shape.num_experts);
          Tensor bias(DType::f32, {shape.num_experts});
          for (int e = 0; e < shape.num_experts; ++e) bias.data<float>()[e] = bias_values[e];
          Tensor x = random_tensor({shape.tokens, shape.hidden}, rng, 1.0);
          Tensor dy = random_tensor({shape.tokens, shape.hidden}, rng, 1.0);
          Tensor wi0 = random_tensor({el, shape.hidden, shape.ffn}, rng, 1.0 / std::sqrt(double(shape.hidden)));
          Tensor wi1 = random_tensor({el, shape.hidden, shape.ffn}, rng, 1.0 / std::sqrt(double(shape.hidden)));
          Tensor wo = random_tensor({el, shape.ffn, shape.hidden}, rng, 1.0 / std::sqrt(double(shape.ffn)));
          EpConfig config{
              .num_experts = shape.num_experts, .top_k = shape.top_k, .hidden = shape.hidden, .tag_base = 1 << 20};
          config.balance = slots > 0 ? BalanceMode::dynamic : BalanceMode::off;
          config.redundant_slots = slots;
          config.rebalance_threshold = args.number("rebalance_threshold", 1.05);
          EpConfig group_config = config;
          group_config.dispatch = dispatch;
          EpGroup group(comm, group_config);
          MoeLayer layer(
              {.hidden = shape.hidden,
               .ffn = shape.ffn,
               .router = {.kind = RouterKind::sigmoid_grouped, .num_experts = shape.num_experts, .top_k = shape.top_k}},
              group);
          const MoeWeights weights{gate, wi0, wi1, wo, bias};
          Tensor y;
          // A new weight version every step (the layer's default), as after
          // every optimizer step: every replica's weights move every step.
          const Timing t = measure(comm, timing, [&] {
            y = layer.forward(x, weights).y;
            layer.backward(dy);
          });
          stats[comm.rank()] = layer.last_step_stats().dispatch;
          replica_stats[comm.rank()] = layer.last_step_stats().replicas;
          if (comm.rank() == 0) {
            result_timing = t;
            y_sample.assign(y.span<float>().begin(), y.span<float>().end());
          }
        });
        std::int64_t weight_bytes = 0, gradient_bytes = 0;
        double planner_us = 0;
        for (const auto& s : stats) {
          if (auto it = s.bytes_sent.find("forward/replica weights"); it != s.bytes_sent.end())
            weight_bytes += it->second;
          if (auto it = s.bytes_sent.find("backward/replica gradients"); it != s.bytes_sent.end())
            gradient_bytes += it->second;
        }
        for (const auto& s : replica_stats) planner_us = std::max(planner_us, s.planner_seconds * 1e6);
        if (slots == 0) {
          off_median = result_timing.median_s;
          y_off = y_sample;
        } else if (args.verify()) {
          double max_diff = 0, max_ref = 0;
          for (std::size_t i = 0; i < y_off.size(); ++i) {
            max_diff = std::max(max_diff, double(std::abs(y_sample[i] - y_off[i])));
            max_ref = std::max(max_ref, double(std::abs(y_off[i])));
          }
          if (max_diff > 1e-5 * max_ref)
            throw InternalError("bench_ep_layer replicas: B=" + std::to_string(slots) +
                                " disagrees with replicas off: " + std::to_string(max_diff));
        }
        // Loads without a plan: rows per rank measured with B = 0.
        double before = replica_stats[0].max_over_mean_before, after = replica_stats[0].max_over_mean_after;
        if (slots == 0) {
          std::vector<std::int64_t> loads;
          for (const auto& s : stats) {
            std::int64_t rows = 0;
            for (std::int64_t v : s.rows_per_local_expert) rows += v;
            loads.push_back(rows);
          }
          std::int64_t max_load = 0, total = 0;
          for (std::int64_t v : loads) {
            max_load = std::max(max_load, v);
            total += v;
          }
          before = after = total > 0 ? double(max_load) * loads.size() / double(total) : 1.0;
        }
        std::printf("%-8s %-9s %3d %10.2f %7.2fx %9.3f %9.3f %9d %14.2f %14.2f %9.1f\n",
                    placement == balance::HotExpertPlacement::packed ? "packed" : "spread", to_string(dispatch).c_str(),
                    slots, result_timing.median_s * 1e3, off_median / result_timing.median_s, before, after,
                    replica_stats[0].num_replicas, weight_bytes / 1e6, gradient_bytes / 1e6, planner_us);
      }
    }
  }
  std::printf(
      "max/mean: rows per rank over the mean (the plan's before/after; B=0 measured); weights/grads "
      "MB: replica weights sent forward and replica gradients sent home, summed over ranks, per step\n");
  return 0;
}

}  // namespace

int run_ep_layer_bench(int argc, char** argv) {
  const BenchArgs args = BenchArgs::parse(argc, argv);
  if (modelled_clock(args)) return run_modelled_layer_bench(args);
  if (args.part == "remat") return run_remat_bench(args);
  if (args.part == "replicas") return run_replicas_bench(args);
  const LayerShape shape = shape_from(args, 4);
  const int num_ranks = shape.num_ranks, num_experts = shape.num_experts, top_k = shape.top_k;
  const std::int64_t tokens = shape.tokens, hidden = shape.hidden, ffn = shape.ffn;
  const transport::threads::ThreadsOptions threads = links_from(args);
  TimingOptions timing = args.timing();
  timing.min_seconds = args.number("min_seconds", 1.0);

  const std::vector<Variant> variants = {
      {"alltoall", DispatchKind::alltoall},
      {"alltoall dedup", DispatchKind::alltoall, true},
      {"ring", DispatchKind::ring},
      {"ring chunks=4", DispatchKind::ring, false, 4},
      {"ring fp8=tensor", DispatchKind::ring, false, 1, TokenFormat::fp8_tensor},
      {"ring chunks=4 fp8", DispatchKind::ring, false, 4, TokenFormat::fp8_tensor},
      {"alltoall dedup fp8", DispatchKind::alltoall, true, 1, TokenFormat::fp8_token},
  };
  std::printf("EP layer fwd+bwd: R=%d ranks as threads, N_l=%lld H=%lld F=%lld E=%d K=%d; links %s\n", num_ranks,
              (long long)tokens, (long long)hidden, (long long)ffn, num_experts, top_k,
              threads.links.enabled ? (std::to_string(threads.links.bandwidth_gb_per_s) + " GB/s, " +
                                       std::to_string(threads.links.latency_us) + " us, " +
                                       transport::threads::link_topology_name(threads.links.topology))
                                          .c_str()
                                    : "unthrottled");
  trace_first_configuration(args, shape, threads,
                            {.name = variants[0].name, .dispatch = variants[0].dispatch, .tokens = tokens});
  std::map<std::string, Result> results;
  for (const Variant& v : variants) {
    Result& result = results[v.name];
    transport::threads::run_ranks(num_ranks, threads, [&](transport::Communicator& comm) {
      Rng rng = rank_rng(comm.rank());
      const int el = num_experts / num_ranks;
      Tensor gate = replicated_gate(hidden, num_experts);
      Tensor x = random_tensor({tokens, hidden}, rng, 1.0), dy = random_tensor({tokens, hidden}, rng, 1.0);
      Tensor wi0 = random_tensor({el, hidden, ffn}, rng, 1.0 / std::sqrt(double(hidden)));
      Tensor wi1 = random_tensor({el, hidden, ffn}, rng, 1.0 / std::sqrt(double(hidden)));
      Tensor wo = random_tensor({el, ffn, hidden}, rng, 1.0 / std::sqrt(double(ffn)));
      EpConfig config{.num_experts = num_experts,
                      .top_k = top_k,
                      .hidden = hidden,
                      .num_chunks = v.chunks,
                      .dedup = v.dedup,
                      .token_format = v.tokens,
                      .tag_base = 1 << 20};
      EpConfig group_config = config;
      group_config.dispatch = v.dispatch;
      EpGroup group(comm, group_config);
      MoeLayer layer({.hidden = hidden, .ffn = ffn, .router = {.num_experts = num_experts, .top_k = top_k}}, group);
      const MoeWeights weights{gate, wi0, wi1, wo, {}};
      Tensor y;
      const Timing t = measure(comm, timing, [&] {
        y = layer.forward(x, weights).y;
        layer.backward(dy);
      });
      if (comm.rank() == 0) {
        result.timing = t;
        result.bytes_sent = layer.last_step_stats().dispatch.bytes_sent;
        result.y_sample.assign(y.span<float>().begin(), y.span<float>().end());
      }
    });
  }

  // Verification: every f32 variant computes the same y (to fp32 round-off).
  if (args.verify()) {
    const std::vector<float>& reference = results["alltoall"].y_sample;
    for (const Variant& v : variants) {
      if (v.tokens != TokenFormat::f32) continue;
      double max_diff = 0, max_ref = 0;
      for (std::size_t i = 0; i < reference.size(); ++i) {
        max_diff = std::max(max_diff, double(std::abs(results[v.name].y_sample[i] - reference[i])));
        max_ref = std::max(max_ref, double(std::abs(reference[i])));
      }
      if (max_diff > 1e-5 * max_ref)
        throw InternalError("bench_ep_layer: " + v.name + " disagrees with alltoall: " + std::to_string(max_diff));
    }
  }

  const double row_bytes = double(hidden) * 4;
  const int el = num_experts / num_ranks;
  const double analytic_alltoall = tokens * top_k * double(num_ranks - 1) / num_ranks * row_bytes;
  const double analytic_dedup = tokens * (num_ranks - 1) * hit_probability(num_experts, el, top_k) * row_bytes;
  const double analytic_ring = double(num_ranks - 1) * tokens * row_bytes;
  std::printf("%-20s %10s %8s %14s %14s %9s\n", "variant", "median ms", "spread", "tokens sent", "analytic",
              "measured/analytic");
  const double base = results["ring"].timing.median_s;
  for (const Variant& v : variants) {
    const Result& r = results[v.name];
    const bool ring = v.dispatch == DispatchKind::ring;
    const std::string key = ring ? "forward/ring_all_gather tokens" : "forward/all_to_all_v tokens";
    const double sent = double(r.bytes_sent.count(key) ? r.bytes_sent.at(key) : 0);
    double analytic = ring ? analytic_ring : (v.dedup ? analytic_dedup : analytic_alltoall);
    if (v.tokens == TokenFormat::fp8_tensor) analytic /= 4;
    if (v.tokens == TokenFormat::fp8_token) analytic *= (hidden + 4.0) / (4.0 * hidden);
    std::printf("%-20s %10.2f %7.0f%% %11.2f MB %11.2f MB %9.3f   (x%.2f vs ring)\n", v.name.c_str(),
                r.timing.median_s * 1e3, 100 * (r.timing.max_s - r.timing.min_s) / r.timing.median_s, sent / 1e6,
                analytic / 1e6, sent / analytic, base / r.timing.median_s);
  }
  std::printf(
      "analytic (DESIGN.md §4.6, uniform routing): ring (R-1)·N_l·H·4; all-to-all K·N_l·H·4·(R-1)/R; "
      "dedup N_l·H·4·(R-1)·P(hit), P(hit) = 1 - C(E-E_l,K)/C(E,K) = %.3f\n",
      hit_probability(num_experts, el, top_k));
  return 0;
}

}  // namespace epmoe::bench
