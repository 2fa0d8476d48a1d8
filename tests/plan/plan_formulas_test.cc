// plan/ formulas against hand-computed cases and published numbers:
//  * parameter counts of the presets against the models' published totals;
//  * P(hit) = 1 - C(E-E_l,K)/C(E,K) against enumeration of every K-subset;
//  * ring / all-to-all bytes for R=4, N_l=5, H=8, K=2 worked by hand, the
//    control streams (count round, token counts, fp8 scales, replica
//    counts) too;
//  * the ring-vs-all-to-all crossover at R = K;
//  * the seed's finding: DeepSeek-V3 on v7x (fsdp 64 x ep 8) with x_sorted
//    saved FITS at per_device_batch_size=1, EXCEEDS at 4, and fits at 4 when
//    x_sorted is recomputed;
//  * spec files: unknown / missing fields named with file and line.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "core/error.h"
#include "hardware/hardware.h"
#include "plan/activation_sizes.h"
#include "plan/communication_model.h"
#include "plan/memory_model.h"
#include "plan/plan_report.h"
#include "plan/step_time.h"

namespace epmoe::plan {
namespace {

TEST(Model, PresetParameterCountsMatchPublishedTotals) {
  struct Case {
    const char* name;
    double total_billions;
    double active_billions;
  };
  // DeepSeek-V3: 671B total, 37B activated (paper); Mixtral 8x7B: 46.7B total,
  // 12.9B active; Qwen3-235B-A22B: 235B total, 22B activated. Active counts
  // here include the LM head and exclude the embedding lookup.
  for (const Case c :
       {Case{"deepseek3-671b", 671, 37}, Case{"mixtral-8x7b", 46.7, 12.9}, Case{"qwen3-235b-a22b", 235, 22}}) {
    const ModelSpec m = load_model("model", c.name);
    const ParameterCounts p = count_parameters(m);
    EXPECT_NEAR(p.total(m) / 1e9, c.total_billions, 0.01 * c.total_billions) << c.name;
    EXPECT_NEAR(p.active_matmul(m) / 1e9, c.active_billions, 0.05 * c.active_billions) << c.name;
  }
}

TEST(Communication, HitProbabilityEqualsEnumerationOfEverySubset) {
  // Every K-subset of E experts equally likely: the fraction that touches
  // experts [0, E_l) (one rank's) is the definition of P(hit).
  for (int e : {4, 6, 8})
    for (int k = 1; k <= 3; ++k)
      for (int el : {1, 2, e / 2, e}) {
        std::int64_t subsets = 0, hits = 0;
        for (int mask = 0; mask < (1 << e); ++mask) {
          if (__builtin_popcount(mask) != k) continue;
          ++subsets;
          hits += (mask & ((1 << el) - 1)) != 0;
        }
        EXPECT_NEAR(probability_rank_hit(e, el, k), double(hits) / subsets, 1e-12)
            << "E=" << e << " K=" << k << " E_l=" << el;
      }
}

TEST(Communication, RingAndAllToAllBytesByHand) {
  const DispatchShape s{.num_ranks = 4,
                        .tokens_per_rank = 5,
                        .hidden = 8,
                        .top_k = 2,
                        .num_experts = 8,
                        .token_row_bytes = 32,
                        .activation_bytes = 4};
  const auto ring = ring_collective_bytes(s, /*remat_x_sorted=*/true);
  // ·N_l = 15 rows from the other ranks.
  EXPECT_EQ(ring[0].bytes, 15 * 32);         // tokens
  EXPECT_EQ(ring[1].bytes, 15 * 2 * 2 * 4);  // routing: ids + weights
  EXPECT_EQ(ring[2].bytes, 15 * 8 * 4);      // combine
  EXPECT_EQ(ring[5].bytes, 15 * 2 * 4);      // dweights
  ASSERT_EQ(ring.size(), 9u);
  EXPECT_EQ(ring[6].bytes, ring[0].bytes);  // remat repeats the gather
  EXPECT_EQ(ring[8].name, "forward/ring token counts");
  EXPECT_EQ(ring[8].bytes, 3 * 8);  // this rank's N_l, one i64 to each of the 3 others
  // Uniform routing, no dedup: N_l·K·(R-1)/R = 7.5 pairs leave the rank.
  const AllToAllTraffic t = expected_alltoall_traffic(s, false);
  EXPECT_DOUBLE_EQ(t.pairs_sent, 7.5);
  EXPECT_DOUBLE_EQ(t.rows_sent, 7.5);
  const auto a2a = alltoall_collective_bytes(s, t, false);
  EXPECT_DOUBLE_EQ(a2a[0].bytes, 7.5 * 32);
  EXPECT_DOUBLE_EQ(a2a[1].bytes, 4 * (7.5 + 2 * 7.5));
  // Dedup: E_l = 2 of 8, K = 2: P(hit) = 1 - (6·5)/(8·7) = 13/28.
  const AllToAllTraffic d = expected_alltoall_traffic(s, true);
  EXPECT_DOUBLE_EQ(d.rows_sent, 5 * 3 * 13.0 / 28.0);
  EXPECT_DOUBLE_EQ(d.pairs_sent, 7.5);
}

// The small streams that say how much payload comes and how to decode it,
// R=4, E=8, 3 token chunks; fp8 scales and replica counts only when
// configured, and under the same names for both dispatchers.
TEST(Communication, ControlStreamsByHand) {
  DispatchShape s{.num_ranks = 4,
                  .tokens_per_rank = 5,
                  .hidden = 8,
                  .top_k = 2,
                  .num_experts = 8,
                  .token_row_bytes = 8,
                  .activation_bytes = 4,
                  .num_chunks = 3};
  const auto by_name = [](const std::vector<CollectiveBytes>& collectives) {
    std::map<std::string, double> out;
    for (const CollectiveBytes& c : collectives) out[c.name] = c.bytes;
    return out;
  };
  const AllToAllTraffic t = expected_alltoall_traffic(s, false);
  for (bool configured : {false, true}) {
    s.fp8_tensor_scale = s.replicas = configured;
    auto ring = by_name(ring_collective_bytes(s, false));
    auto a2a = by_name(alltoall_collective_bytes(s, t, false));
    EXPECT_EQ(ring.at("forward/ring token counts"), 3 * 8);       // one i64 to each other rank, once a step
    EXPECT_EQ(a2a.at("forward/all_to_all_v counts"), 3 * 8 * 3);  // one i64 to each other rank, per chunk
    EXPECT_EQ(ring.count("forward/all_to_all_v counts") + a2a.count("forward/ring token counts"), 0u);
    for (auto* bytes : {&ring, &a2a}) {
      EXPECT_EQ(bytes->count("forward/ring_all_gather fp8 scale"), configured ? 1u : 0u);
      EXPECT_EQ(bytes->count("forward/ring_all_gather replica counts"), configured ? 1u : 0u);
      if (!configured) continue;
      EXPECT_EQ(bytes->at("forward/ring_all_gather fp8 scale"), 3 * 3 * 4);       // 3 chunks' f32 maxima
      EXPECT_EQ(bytes->at("forward/ring_all_gather replica counts"), 3 * 8 * 8);  // E i64 pair counts
    }
  }
}

TEST(Communication, RingMovesFewerTokenRowsExactlyWhenRanksBelowTopK) {
  for (int k : {2, 8})
    for (int r : {2, 4, 8, 16, 32, 64}) {
      const DispatchShape s{.num_ranks = r,
                            .tokens_per_rank = 4096,
                            .hidden = 7168,
                            .top_k = k,
                            .num_experts = 256,
                            .token_row_bytes = 7172,
                            .activation_bytes = 2};
      const double ring = token_bytes(ring_collective_bytes(s, false));
      const double a2a = token_bytes(alltoall_collective_bytes(s, expected_alltoall_traffic(s, false), false));
      const double dedup = token_bytes(alltoall_collective_bytes(s, expected_alltoall_traffic(s, true), false));
      if (r < k) {
        EXPECT_LT(ring, a2a) << "R=" << r << " K=" << k;
      }
      if (r == k) {
        EXPECT_DOUBLE_EQ(ring, a2a) << "R=" << r << " K=" << k;
      }
      if (r > k) {
        EXPECT_GT(ring, a2a) << "R=" << r << " K=" << k;
      }
      EXPECT_LE(dedup, a2a);   // dedup never sends more rows
      EXPECT_LE(dedup, ring);  // at most one row per (token, other rank)
    }
}

TEST(StepTime, MeanRingHops) {
  EXPECT_DOUBLE_EQ(mean_ring_hops(2), 1.0);
  EXPECT_DOUBLE_EQ(mean_ring_hops(4), 4.0 / 3.0);  // 1 + 2 + 1 over 3
  EXPECT_DOUBLE_EQ(mean_ring_hops(8), 16.0 / 7.0);
}

TEST(Memory, XSortedBundleByHand) {
  // 10 rows of 40 bytes, 12 B metadata per row, 8 per local expert.
  EXPECT_DOUBLE_EQ(x_sorted_bytes(10, SavedRowForm::f32, 10, 2), 400 + 120 + 16);
  EXPECT_DOUBLE_EQ(x_sorted_bytes(10, SavedRowForm::bf16, 10, 2), 200 + 120 + 16);
  EXPECT_DOUBLE_EQ(x_sorted_bytes(10, SavedRowForm::fp8_tensor, 10, 2), 100 + 4 + 120 + 16);
  EXPECT_DOUBLE_EQ(x_sorted_bytes(10, SavedRowForm::fp8_token, 10, 2), 140 + 120 + 16);
  EXPECT_DOUBLE_EQ(routed_expert_activation_bytes("mlpwi_0", 10, 8, 6, 4), 240);
  EXPECT_DOUBLE_EQ(routed_expert_activation_bytes("mlpwo", 10, 8, 6, 4), 320);
}

PlanConfig seed_recipe(double per_device_batch_size) {
  // The seed: v7x 4x8x8, fsdp 64 x ep 8, seq 4096, ring of experts, fp8 token
  // all-gather, ragged_buffer_factor 2, num_moe_token_chunks 2,
  // decoder_layer_input=offload, context and out_proj on device, x_sorted on device.
  PlanConfig c;
  c.model = load_model("model", "deepseek3-671b");
  c.hardware = hardware::load_hardware("hardware", "tpu-v7x");
  c.parallel = {.fsdp = 64, .ep = 8, .per_device_batch_size = per_device_batch_size, .seq_len = 4096};
  c.dispatch = DispatchKind::ring;
  c.token_transfer = TokenTransfer::fp8_token;
  c.token_buffer_factor = 2;
  c.token_chunks = 2;
  c.remat = default_remat();
  c.remat["decoder_layer_input"] = RematChoice::offload;
  c.remat["context"] = RematChoice::save;
  c.remat["out_proj"] = RematChoice::save;
  c.remat["x_sorted"] = RematChoice::save;
  return c;
}

TEST(Memory, SeedRecipeFitsAtBatchOneAndExceedsAtFour) {
  const MemoryBreakdown one = project_memory(seed_recipe(1));
  const MemoryBreakdown four = project_memory(seed_recipe(4));
  EXPECT_TRUE(one.fits) << one.device_total_bytes / 1e9 << " GB";
  EXPECT_FALSE(four.fits) << four.device_total_bytes / 1e9 << " GB";
  // Why: x_sorted grows with the tokens per device (4x), the state does not.
  EXPECT_DOUBLE_EQ(four.category_bytes("optimizer state"), one.category_bytes("optimizer state"));
  EXPECT_NEAR(four.item_bytes("x_sorted") / one.item_bytes("x_sorted"), 4.0, 1e-5);  // + 8 B per local expert, constant
  EXPECT_GT(four.item_bytes("x_sorted"), four.usable_bytes - one.device_total_bytes + one.item_bytes("x_sorted"));
  // The seed's advice: recompute x_sorted at batch 4 and it fits.
  PlanConfig remat = seed_recipe(4);
  remat.remat["x_sorted"] = RematChoice::remat;
  EXPECT_TRUE(project_memory(remat).fits);
  // The offloaded layer input is on the host, not the device.
  EXPECT_EQ(one.item_bytes("decoder_layer_input"), 0);
  ASSERT_EQ(one.host.size(), 1u);
  EXPECT_EQ(one.host[0].name, "decoder_layer_input");
}

TEST(Memory, ParametersAreSixteenBytesPerParameterPerShard) {
  const PlanConfig c = seed_recipe(1);
  const MemoryBreakdown m = project_memory(c);
  const double params = count_parameters(c.model).total(c.model) / 512;
  EXPECT_NEAR(m.category_bytes("parameters") + m.category_bytes("gradients") + m.category_bytes("optimizer state"),
              16 * params, 1e-6 * params);
}

TEST(Config, RulesNameTheKey) {
  PlanConfig c = seed_recipe(1);
  c.parallel.ep = 7;
  try {
    c.validate();
    FAIL() << "ep=7 must not divide 256 experts";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ep=7"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_model("model", "no-such-model"), ConfigError);
  EXPECT_THROW(hardware::load_hardware("hardware", "tpu-v9"), ConfigError);
}

// fsdp = 2^63 - 1 used to wrap the device count to -8 and report FITS.
TEST(Config, DeviceCountOverflowIsRefusedNamingTheKey) {
  PlanConfig c = seed_recipe(1);
  c.parallel.fsdp = std::numeric_limits<std::int64_t>::max();
  try {
    c.validate();
    FAIL() << "dp*fsdp*ep*tp overflows int64";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fsdp=9223372036854775807"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("overflows"), std::string::npos) << e.what();
  }
  c.parallel.fsdp = std::int64_t{1} << 40;  // fits int64, but tokens per step exceed 2^53
  EXPECT_THROW(c.validate(), ConfigError);
  c.parallel.fsdp = 64;
  EXPECT_NO_THROW(c.validate());
}

std::filesystem::path write_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path;
}

TEST(SpecFile, ModelYamlLoadsAndBadFieldsAreNamed) {
  const std::string mixtral_yaml =
      "num_layers: 32\nhidden: 4096\nmoe_ffn: 14336\nnum_experts: 8\ntop_k: 2\nvocab: 32000\n"
      "attention:\n  num_heads: 32\n  num_kv_heads: 8\n  qk_head_dim: 128\n  v_head_dim: 128\n";
  const ModelSpec from_file = load_model("model", write_file("plan_mixtral.yaml", mixtral_yaml).string());
  const ModelSpec preset = load_model("model", "mixtral-8x7b");
  EXPECT_DOUBLE_EQ(count_parameters(from_file).total(from_file), count_parameters(preset).total(preset));

  const auto unknown = write_file("plan_unknown.yaml", mixtral_yaml + "topk: 3\n");
  try {
    load_model("model", unknown.string());
    FAIL();
  } catch (const FileError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("plan_unknown.yaml:12"), std::string::npos) << what;
    EXPECT_NE(what.find("'topk'"), std::string::npos) << what;
  }
  const auto missing = write_file("plan_missing.yaml", "num_layers: 2\n");
  try {
    load_model("model", missing.string());
    FAIL();
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find("hidden"), std::string::npos) << e.what();
  }
  const auto bad_value = write_file("plan_bad.yaml", "memory_gb: lots\n");
  try {
    hardware::load_hardware("hardware", bad_value.string());
    FAIL();
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find("memory_gb=lots"), std::string::npos) << e.what();
  }
}

TEST(Report, ChosenDispatcherAndVerdictAppearInText) {
  const PlanReport report = make_plan(seed_recipe(4));
  const std::string text = format_report(report);
  EXPECT_NE(text.find("verdict: EXCEEDS"), std::string::npos);
  EXPECT_EQ(report.chosen().label, "ring");
  EXPECT_EQ(report_to_json(report)["memory"]["verdict"], "EXCEEDS");
}

}  // namespace
}  // namespace epmoe::plan
