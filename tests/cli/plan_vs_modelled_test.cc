// plan/'s step-time formulas (plan/step_time.h, communication_model.h)
// against modelled execution of the same layer (`epmoe layer
// clock=modelled`, compute_time=modelled).
//
// Topology: ranks as threads, R = 4, E = 8, K = 2, on the h100 preset:
// switched links (450 GB/s per GPU each way), link_latency_us=0.001 (the
// plan models no latency), compute_efficiency=0.25 (so that every expert
// GEMM is compute-bound: arithmetic intensity ~128 FLOP/B > 989e12·0.25 /
// 3.35e12 = 74).
// Transport: threads, threads=1 (modelled_cli_fixture.h): one compute thread
// per rank.
#include <cmath>
#include <cstdio>

#include "hardware/hardware.h"
#include "modelled_cli_fixture.h"
#include "plan/communication_model.h"
#include "plan/plan_config.h"
#include "plan/step_time.h"

namespace epmoe::testing {
namespace {

constexpr int kRanks = 4, kExperts = 8, kTopK = 2;
constexpr std::int64_t kHidden = 512, kFfn = 512, kTokensPerRank = 512;
constexpr double kEfficiency = 0.25;

plan::PlanConfig layer_plan() {
  plan::PlanConfig c;
  c.model = {.name = "engine-layer",
             .num_layers = 1,
             .hidden = kHidden,
             .moe_ffn = kFfn,
             .num_experts = kExperts,
             .top_k = kTopK,
             .vocab = 1,
             .attention = {.num_heads = 1, .num_kv_heads = 1, .qk_head_dim = 1, .v_head_dim = 1}};
  c.parallel = {.ep = kRanks, .per_device_batch_size = 1, .seq_len = kTokensPerRank};
  c.hardware = hardware::load_hardware("hardware", "h100");
  c.dispatch = plan::DispatchKind::alltoall;
  c.activation_type = plan::ElementType::f32;  // the engine moves f32 rows
  c.compute_efficiency = kEfficiency;
  for (const std::string& name : plan::activation_names()) c.remat[name] = plan::RematChoice::save;  // engine default
  return c;
}

struct RankCompute {
  double flops = 0;
  double flop_seconds = 0;     // sum of flops / (peak · efficiency)
  double charged_seconds = 0;  // sum of max(flops / (peak · eff), bytes / HBM): what the clock charges
  double encode_seconds = 0;   // of that, packing its tokens ("token encode"), before it launches the exchange
};

// Per rank, from the trace's compute events (f32: no nested scopes).
std::vector<RankCompute> compute_from_trace(const nlohmann::json& events, const hardware::HardwareSpec& hw) {
  std::vector<RankCompute> out(kRanks);
  for (const nlohmann::json& e : events) {
    if (e.value("cat", "") != "compute") continue;
    RankCompute& r = out.at(e.at("pid").get<std::size_t>());
    const double flops = e.at("args").at("flops").get<double>(), bytes = e.at("args").at("bytes").get<double>();
    const double flop_seconds = flops / (hw.peak_bf16_flops * kEfficiency);
    r.flops += flops;
    r.flop_seconds += flop_seconds;
    r.charged_seconds += std::max(flop_seconds, bytes / hw.memory_bytes_per_s);
    if (e.at("name") == "token encode") r.encode_seconds += std::max(flop_seconds, bytes / hw.memory_bytes_per_s);
  }
  return out;
}

class PlanVsModelled : public ModelledCli {
 protected:
  nlohmann::json run(const std::filesystem::path& in, const std::filesystem::path& trace,
                     std::vector<std::string> extra = {}) {
    std::vector<std::string> keys = {"ranks=4",
                                     "clock=modelled",
                                     "dispatch=alltoall",
                                     "compute_efficiency=" + std::to_string(kEfficiency),
                                     "link_latency_us=0.001",
                                     "trace_file=" + trace.string()};
    keys.insert(keys.end(), extra.begin(), extra.end());
    return layer_metrics(in, keys);
  }
};

TEST_F(PlanVsModelled, UniformRoutingAgreesAndSkewIsInvisibleToThePlan) {
  const plan::PlanConfig config = layer_plan();
  config.validate();
  const plan::DispatchShape shape = config.dispatch_shape();
  const double ep_bytes =
      plan::total_bytes(plan::alltoall_collective_bytes(shape, plan::expected_alltoall_traffic(shape, false), false));
  const plan::StepTime estimate = plan::estimate_step_time(config, ep_bytes);

  const std::filesystem::path in = dir("in");
  generate(in, {.tokens = kRanks * kTokensPerRank, .hidden = kHidden, .ffn = kFfn, .experts = kExperts});
  const nlohmann::json uniform = run(in, dir("uniform.json"), {"router=random", "seed=1"});
  ASSERT_FALSE(uniform.is_null());
  const nlohmann::json events = check_trace_structure(dir("uniform.json"), 1e-6, "uniform");
  const std::vector<RankCompute> traced = compute_from_trace(events, config.hardware);
  // Compute. FLOPs: the plan's 6·(active matmul parameters)·T against the
  // FLOPs the engine's kernels charged: equal in the mean over ranks within
  // 1% (the plan adds a 1-head, 1-dim attention and a vocab-1 head, ~0.2%);
  // per rank within 7% (random routing: a rank's rows are N_l·K ± ~5%).
  double mean_flops = 0, mean_flop_seconds = 0;
  for (int r = 0; r < kRanks; ++r) {
    mean_flops += traced[r].flops / kRanks;
    mean_flop_seconds += traced[r].flop_seconds / kRanks;
    EXPECT_NEAR(traced[r].flops / estimate.model_flops, 1.0, 0.07) << "rank " << r;
    // The clock charged exactly max(FLOP time, HBM time) per operation
    // (to picosecond rounding per operation).
    EXPECT_NEAR(rank_modelled(uniform, r, "compute_seconds"), traced[r].charged_seconds, 1e-9) << "rank " << r;
  }
  EXPECT_NEAR(mean_flops / estimate.model_flops, 1.0, 0.01);
  EXPECT_NEAR(mean_flop_seconds / estimate.flop_seconds, 1.0, 0.01);
  // Compute time: the clock charges max(FLOP time, HBM time) per
  // operation, so beside the FLOP-bound GEMMs it charges every memory-bound
  // step (SwiGLU, the row gathers, token packing, the combine's weighted
  // sums and their backward, docs/MODELLED_TIME.md) at HBM bandwidth; the
  // plan charges the same bytes (plan::moe_data_movement_bytes, for the
  // mean rows N_l·K). Here the data movement is ~100% of the FLOP time
  // (measured 0.97-1.00 per rank), so without it the plan was off by half;
  // with it, per rank within 10% (random routing: a rank's rows are
  // N_l·K ± ~5%; the memory-bound steps' own FLOPs and the GEMMs' few
  // memory-bound groups are the rest), and in the mean over ranks within 5%.
  double mean_charged = 0;
  for (int r = 0; r < kRanks; ++r) {
    mean_charged += traced[r].charged_seconds / kRanks;
    EXPECT_NEAR(traced[r].charged_seconds / estimate.compute_seconds, 1.0, 0.1) << "rank " << r;
  }
  EXPECT_NEAR(mean_charged / estimate.compute_seconds, 1.0, 0.05);
  EXPECT_GT(estimate.data_movement_seconds, 0.5 * estimate.flop_seconds);
  // EP communication: the plan's bytes / 450 GB/s against the time each
  // rank waited on its collectives (communication + idle; token_chunks=1,
  // so nothing is hidden except the small routing exchange beside the
  // tokens). NOT within 5%: modelled is 1.08-1.23x the plan, which is a
  // lower bound: it assumes every rank sends and receives the mean bytes,
  // while random routing gives each (source, destination) pair ~5% more or
  // less, so the pairwise schedule's steps drift apart and a receiver's
  // ingress port takes two messages at once here and there (the switch's
  // ports themselves run at full rate: tests/comm/modelled_time_test.cc,
  // ASwitchedAllToAllRunsAtTheInjectionBandwidth); plus the count and
  // routing exchanges and one latency per round. Asserted: within 1.3x.
  // Lower bound: since issue 30 charges the dispatchers' data movement, a
  // rank packs its tokens ("token encode") and, in the backward, sums and
  // copies rows while its peers' messages, posted when they finished the
  // same work on their (randomly routed, ±5%) rows, already travel towards
  // it: per rank the waits are no longer bounded by the plan's mean-bytes
  // time (ranks 2, 3 waited 0.87-0.90x of it), but over the ranks every
  // byte still crosses a port: the mean wait is at least the plan's time
  // less the mean packing.
  double mean_waits = 0, mean_encode = 0;
  for (int r = 0; r < kRanks; ++r) {
    const double waits = rank_modelled(uniform, r, "communication_seconds") + rank_modelled(uniform, r, "idle_seconds");
    mean_waits += waits / kRanks;
    mean_encode += traced[r].encode_seconds / kRanks;
    EXPECT_LE(waits, 1.3 * estimate.ep_seconds) << "rank " << r;
  }
  EXPECT_GE(mean_waits, estimate.ep_seconds - mean_encode);

  // Skewed routing (the plan's input is the same config, so its estimate is
  // the same): rank 0's experts get 80% of the (token, expert) pairs' first
  // choices (t mod 10 pattern of ModelledLayer.ARankWithTwiceTheRows...):
  // 1.6x the uniform N_l·K rows. The plan cannot see it: rank 0's charged
  // FLOP time is > 1.5x the plan's compute and the modelled step exceeds
  // both the uniform run's step and the plan's serial bound.
  const std::filesystem::path skewed_in = dir("skewed");
  generate(skewed_in, {.tokens = kRanks * kTokensPerRank, .hidden = kHidden, .ffn = kFfn, .experts = kExperts});
  craft_routing(skewed_in, [](std::int64_t t) -> std::pair<int, int> {
    const int slot = static_cast<int>(t % 10), alt = static_cast<int>((t / 10) % 2);
    if (slot < 4) return {0 + alt, 2 + alt};
    if (slot < 8) return {0 + alt, 4 + alt};
    return {6, 7};
  });
  const nlohmann::json skewed = run(skewed_in, dir("skewed.json"));
  ASSERT_FALSE(skewed.is_null());
  const std::vector<RankCompute> skewed_compute =
      compute_from_trace(check_trace_structure(dir("skewed.json"), 1e-6, "skewed"), config.hardware);
  EXPECT_EQ(skewed.at("modelled").at("critical_path_rank").get<int>(), 0);
  EXPECT_GT(skewed_compute[0].flop_seconds, 1.5 * estimate.flop_seconds);
  const double uniform_step = uniform.at("modelled").at("step_seconds").get<double>();
  const double skewed_step = skewed.at("modelled").at("step_seconds").get<double>();
  EXPECT_GT(skewed_step, uniform_step);
  EXPECT_GT(skewed_step, estimate.serial_seconds);
  std::printf("plan: compute %.3g s, ep %.3g s, serial %.3g s; modelled step: uniform %.3g s, skewed %.3g s\n",
              estimate.compute_seconds, estimate.ep_seconds, estimate.serial_seconds, uniform_step, skewed_step);
}

// The ring's bf16-wire reduce-scatters (combine, dx): the bytes of the
// conversions the clock charges on their own clocks (traced on the
// collective lanes, "reduce_scatter to bf16" / "from bf16") are exactly the
// plan's ring_wire_conversion_bytes on every rank (a ring's blocks are the
// ranks' token rows, whatever the routing), and each is charged at the HBM
// rate. compute_dtype stays f32 (wire_dtype=bf16 alone), which the plan's
// bf16 activation type stands for here.
TEST_F(PlanVsModelled, RingBf16WireConversionsAreThePlansBytes) {
  plan::PlanConfig config = layer_plan();
  config.dispatch = plan::DispatchKind::ring;
  config.activation_type = plan::ElementType::bf16;
  config.validate();
  const double planned = plan::ring_wire_conversion_bytes(config);
  ASSERT_GT(planned, 0);
  const std::filesystem::path in = dir("in");
  generate(in, {.tokens = kRanks * kTokensPerRank, .hidden = kHidden, .ffn = kFfn, .experts = kExperts});
  const nlohmann::json m = run(in, dir("ring.json"), {"dispatch=ring", "wire_dtype=bf16", "router=random", "seed=1"});
  ASSERT_FALSE(m.is_null());
  std::vector<double> bytes(kRanks), seconds(kRanks);
  int events = 0;
  for (const nlohmann::json& e : check_trace_structure(dir("ring.json"), 1e-6, "ring")) {
    const std::string name = e.value("name", "");
    if (name != "reduce_scatter to bf16" && name != "reduce_scatter from bf16") continue;
    ASSERT_EQ(e.at("cat"), "collective") << name;
    const auto r = e.at("pid").get<std::size_t>();
    bytes.at(r) += e.at("args").at("bytes").get<double>();
    seconds.at(r) += e.at("dur").get<double>() * 1e-6;
    ++events;
  }
  ASSERT_GT(events, 0);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(bytes[r], planned) << "rank " << r;
    // At the HBM rate, to a picosecond per conversion.
    EXPECT_NEAR(seconds[r], bytes[r] / config.hardware.memory_bytes_per_s, 1e-12 * events) << "rank " << r;
  }
}

}  // namespace
}  // namespace epmoe::testing
