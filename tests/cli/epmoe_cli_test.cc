// End-to-end tests of the `epmoe` executable, run as a subprocess in a fresh
// scratch directory per test. Inputs: `epmoe gen-inputs` with N=16 tokens,
// H=8, F=12, E=4 experts (small, so each run takes milliseconds), then
// `epmoe layer` with top_k=2. Bad-input cases corrupt one input file or pass
// one bad key and assert: exit code 2, exactly one stderr line
// "epmoe: error: ..." naming the file or key and the rule, and no output at
// all (no --out directory, no staging directory left beside it).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "data/npy.h"
#include "data/test_files.h"
#include "epmoe_cli_fixture.h"

namespace epmoe {
namespace {

using testing::entries;
using testing::EpmoeCli;
using testing::kExperts;
using testing::kFfn;
using testing::kHidden;
using testing::kTokens;
using testing::kTopK;
using testing::numpy_file_bytes;
using testing::ProcessResult;
using testing::read_bytes;
using testing::run_epmoe;
using testing::write_bytes;

TEST_F(EpmoeCli, HelpListsSubcommandsAndEveryLayerKey) {
  const ProcessResult top = run_epmoe(scratch_, {"--help"});
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_NE(top.stdout_text.find("layer"), std::string::npos) << top.stdout_text;
  EXPECT_NE(top.stdout_text.find("gen-inputs"), std::string::npos) << top.stdout_text;

  const ProcessResult layer = run_epmoe(scratch_, {"layer", "--help"});
  EXPECT_EQ(layer.exit_code, 0);
  for (const std::string key : {"top_k",
                                "router",
                                "norm_topk_prob",
                                "n_groups",
                                "topk_groups",
                                "routed_scaling_factor",
                                "compute_dtype",
                                "seed",
                                "threads",
                                "softmax_topk|sigmoid_grouped|random",
                                "f32|bf16",
                                "--in",
                                "--out",
                                "ranks",
                                "threads|mpi",
                                "alltoall|ring",
                                "dedup",
                                "capacity_factor",
                                "token_chunks",
                                "off|tensor|token|bf16",
                                "wire_dtype",
                                "auto|f32|bf16",
                                "cotangent_all_gather",
                                "ring|plain",
                                "link_bandwidth_gbps",
                                "link_latency_us",
                                "full_mesh|ring",
                                "comm_timeout_ms",
                                "dy rows and dx travel as wire_dtype says, the routing-weight gradients in fp32"}) {
    EXPECT_NE(layer.stdout_text.find(key), std::string::npos) << "missing " << key << " in\n" << layer.stdout_text;
  }
}

TEST_F(EpmoeCli, GenInputsThenLayerWritesEveryOutput) {
  generate_inputs();
  const ProcessResult result = run_layer({"top_k=" + std::to_string(kTopK)});
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(result.stderr_text, "");

  const auto f32 = DType::f32;
  const Tensor y = read_npy(out_dir() / "y.npy", f32);
  EXPECT_EQ(y.shape(), (Shape{kTokens, kHidden}));
  const Tensor ids = read_npy(out_dir() / "topk_ids.npy", DType::i32);
  EXPECT_EQ(ids.shape(), (Shape{kTokens, kTopK}));
  for (std::int32_t id : ids.span<std::int32_t>()) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, kExperts);
  }
  const Tensor weights = read_npy(out_dir() / "topk_weights.npy", f32);
  EXPECT_EQ(weights.shape(), (Shape{kTokens, kTopK}));
  for (std::int64_t t = 0; t < kTokens; ++t) {  // norm_topk_prob=true by default
    EXPECT_NEAR(weights.data<float>()[2 * t] + weights.data<float>()[2 * t + 1], 1.0f, 1e-5f);
  }
  EXPECT_EQ(read_npy(out_dir() / "dx.npy", f32).shape(), (Shape{kTokens, kHidden}));
  EXPECT_EQ(read_npy(out_dir() / "dgate.npy", f32).shape(), (Shape{kHidden, kExperts}));
  EXPECT_EQ(read_npy(out_dir() / "dwi0.npy", f32).shape(), (Shape{kExperts, kHidden, kFfn}));
  EXPECT_EQ(read_npy(out_dir() / "dwi1.npy", f32).shape(), (Shape{kExperts, kHidden, kFfn}));
  EXPECT_EQ(read_npy(out_dir() / "dwo.npy", f32).shape(), (Shape{kExperts, kFfn, kHidden}));
  // Outputs are finite and not all zero (the layer really ran).
  double y_norm = 0;
  for (float value : y.span<float>()) {
    ASSERT_TRUE(std::isfinite(value));
    y_norm += std::abs(value);
  }
  EXPECT_GT(y_norm, 0.0);

  const auto metrics = nlohmann::json::parse(read_bytes(out_dir() / "metrics.json"));
  for (const std::string key : {"top_k", "router", "norm_topk_prob", "n_groups", "topk_groups", "routed_scaling_factor",
                                "compute_dtype", "seed", "threads"}) {
    EXPECT_TRUE(metrics["config"].contains(key)) << key;
  }
  EXPECT_EQ(metrics["config"]["top_k"], kTopK);
  EXPECT_EQ(metrics["config"]["router"], "softmax_topk");
  EXPECT_EQ(metrics["config"]["threads"], 1);
  EXPECT_EQ(metrics["shapes"]["wo"], nlohmann::json({kExperts, kFfn, kHidden}));
  EXPECT_EQ(metrics["shapes"]["topk_ids"], nlohmann::json({kTokens, kTopK}));
  EXPECT_EQ(metrics["dims"]["num_experts"], kExperts);
  std::int64_t routed_pairs = 0;
  for (std::int64_t count : metrics["tokens_per_expert"].get<std::vector<std::int64_t>>()) routed_pairs += count;
  EXPECT_EQ(metrics["tokens_per_expert"].size(), static_cast<std::size_t>(kExperts));
  EXPECT_EQ(routed_pairs, kTokens * kTopK);  // no token dropped
  EXPECT_TRUE(metrics["backward"].get<bool>());
  EXPECT_TRUE(metrics["phase_seconds"].contains("experts"));
  EXPECT_TRUE(metrics["phase_seconds"].contains("backward_experts"));
  EXPECT_GT(metrics["total_seconds"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(metrics["expert_gemm_gflop"].get<double>(),
                   18.0 * kTokens * kTopK * kHidden * kFfn / 1e9);  // 6 fwd + 12 bwd flop per H*F
  EXPECT_GT(metrics["expert_gflop_per_second"].get<double>(), 0.0);
  EXPECT_GT(metrics["saved_activation_peak_bytes"].get<std::int64_t>(), 0);
  // Which implementation ran the products: every product once, the experts'
  // and the router's (2·N·H·E forward, twice that backward).
  double census_gflop = 0;
  for (const nlohmann::json& use : metrics["gemm_implementations"]) {
    EXPECT_FALSE(use["implementation"].get<std::string>().empty());
    EXPECT_EQ(use["compute_dtype"], "f32");
    EXPECT_GT(use["calls"].get<std::int64_t>(), 0);
    census_gflop += use["gflop"].get<double>();
  }
  EXPECT_DOUBLE_EQ(census_gflop, (18.0 * kTokens * kTopK * kHidden * kFfn + 6.0 * kTokens * kHidden * kExperts) / 1e9);
  // ranks=1 with the default dispatcher keys runs the single-rank path: one
  // rank, no communication.
  const auto& expert_parallel = metrics["expert_parallel"];
  EXPECT_EQ(expert_parallel["path"], "single_rank");
  EXPECT_EQ(expert_parallel["ranks"], 1);
  ASSERT_EQ(expert_parallel["per_rank"].size(), 1u);
  EXPECT_EQ(expert_parallel["per_rank"][0]["rows_received"], kTokens * kTopK);
  EXPECT_TRUE(expert_parallel["per_rank"][0]["bytes_sent"].empty());

  EXPECT_EQ(entries(scratch_.path()), (std::set<std::string>{"in", "out"}));  // no staging left
}

TEST_F(EpmoeCli, RunWithoutDyRemovesGradientsOfAnEarlierRun) {
  generate_inputs();
  ASSERT_EQ(run_layer().exit_code, 0);
  ASSERT_TRUE(std::filesystem::exists(out_dir() / "dwo.npy"));

  generate_inputs({"with_dy=false"});
  EXPECT_FALSE(std::filesystem::exists(in_dir() / "dy.npy")) << "stale dy.npy would trigger a backward";
  const ProcessResult result = run_layer();
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(entries(out_dir()), (std::set<std::string>{"y.npy", "topk_ids.npy", "topk_weights.npy", "metrics.json"}));
  const auto metrics = nlohmann::json::parse(read_bytes(out_dir() / "metrics.json"));
  EXPECT_FALSE(metrics["backward"].get<bool>());
}

TEST_F(EpmoeCli, SameSeedSameBytes) {
  generate_inputs({"seed=7"});
  const std::string first = read_bytes(in_dir() / "wi0.npy");
  generate_inputs({"seed=7"});
  EXPECT_EQ(read_bytes(in_dir() / "wi0.npy"), first);
  generate_inputs({"seed=8"});
  EXPECT_NE(read_bytes(in_dir() / "wi0.npy"), first);
}

TEST_F(EpmoeCli, SigmoidGroupedRouterUsesTheBias) {
  generate_inputs({"with_bias=true"});
  const ProcessResult result =
      run_layer({"router=sigmoid_grouped", "n_groups=2", "topk_groups=1", "routed_scaling_factor=2.5"});
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  const auto metrics = nlohmann::json::parse(read_bytes(out_dir() / "metrics.json"));
  EXPECT_TRUE(metrics["bias"].get<bool>());
  EXPECT_EQ(metrics["config"]["routed_scaling_factor"], 2.5);
}

TEST_F(EpmoeCli, ConfigFileIsReadAndTheCommandLineOverridesIt) {
  generate_inputs({"with_bias=true"});
  const std::string example = std::string(EPMOE_SOURCE_DIR) + "/configs/layer_example.yaml";
  const ProcessResult result = run_layer({"--config", example, "routed_scaling_factor=1.5"});
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  const auto metrics = nlohmann::json::parse(read_bytes(out_dir() / "metrics.json"));
  EXPECT_EQ(metrics["config"]["router"], "sigmoid_grouped");  // from the file
  EXPECT_EQ(metrics["config"]["n_groups"], 2);
  EXPECT_EQ(metrics["config"]["routed_scaling_factor"], 1.5);  // the command line wins
}

TEST_F(EpmoeCli, RejectsBadKeyInConfigFileNamingFileAndLine) {
  generate_inputs();
  write_bytes(scratch_ / "in" / "layer.yaml", "top_k: 2\nrouter: softmax\n");
  expect_rejected(run_layer({"--config", (in_dir() / "layer.yaml").string()}),
                  {"layer.yaml:2: router=softmax: expected one of softmax_topk, sigmoid_grouped, random"});
}

TEST_F(EpmoeCli, RejectsTruncatedNpy) {
  generate_inputs();
  const std::string x = read_bytes(in_dir() / "x.npy");
  write_bytes(in_dir() / "x.npy", x.substr(0, x.size() - 4));
  expect_rejected(run_layer(), {"x.npy: data holds", "needs " + std::to_string(kTokens * kHidden * 4)});
}

TEST_F(EpmoeCli, RejectsFloat64Npy) {
  generate_inputs();
  write_bytes(in_dir() / "gate.npy", numpy_file_bytes(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (8, 4), }",
                                                      std::string(8 * 4 * 8, '\0')));
  expect_rejected(run_layer(), {"gate.npy: dtype '<f8' (float64); epmoe reads float32", "astype(np.float32)"});
}

TEST_F(EpmoeCli, RejectsWrongShapeNamingBothShapes) {
  generate_inputs();
  write_npy(in_dir() / "wi1.npy", Tensor::zeros(DType::f32, {kExperts, kHidden, kFfn + 1}));
  expect_rejected(run_layer(), {"wi1.npy: shape [4, 8, 13], expected [4, 8, 12] (E, H, F)"});
}

TEST_F(EpmoeCli, RejectsDyWithAnotherTokenCount) {
  generate_inputs();
  write_npy(in_dir() / "dy.npy", Tensor::zeros(DType::f32, {kTokens + 1, kHidden}));
  expect_rejected(run_layer(), {"dy.npy: shape [17, 8], expected [16, 8] (N, H) from x.npy"});
}

TEST_F(EpmoeCli, RejectsUnknownKeyWithSuggestion) {
  generate_inputs();
  expect_rejected(run_layer({"topk=2"}), {"unknown key 'topk'; did you mean 'top_k'?"});
}

TEST_F(EpmoeCli, RejectsWrongTypedKey) {
  generate_inputs();
  expect_rejected(run_layer({"top_k=two"}), {"top_k=two: expected an integer"});
}

TEST_F(EpmoeCli, RejectsTopKAboveNumExperts) {
  generate_inputs();
  expect_rejected(run_layer({"top_k=5"}), {"top_k=5"});
}

TEST_F(EpmoeCli, RejectsGroupsThatDoNotDivideExperts) {
  generate_inputs();
  expect_rejected(run_layer({"router=sigmoid_grouped", "n_groups=3"}), {"n_groups=3"});
}

TEST_F(EpmoeCli, RejectsBiasTheRouterWouldIgnore) {
  generate_inputs({"with_bias=true"});
  expect_rejected(run_layer(), {"bias.npy", "router=softmax_topk"});
}

TEST_F(EpmoeCli, RejectsMissingInputDirectory) {
  const ProcessResult result =
      run_epmoe(scratch_, {"layer", "--in", (scratch_ / "nowhere").string(), "--out", out_dir().string()});
  expect_rejected(result, {"--in", "nowhere", "no such directory"});
}

TEST_F(EpmoeCli, RejectsMissingRequiredOption) {
  expect_rejected(run_epmoe(scratch_, {"layer", "--out", out_dir().string()}), {"--in"});
}

TEST_F(EpmoeCli, FailedRunLeavesAnEarlierOutputUntouched) {
  generate_inputs();
  ASSERT_EQ(run_layer().exit_code, 0);
  const std::string metrics = read_bytes(out_dir() / "metrics.json");
  const ProcessResult result = run_layer({"top_k=9"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_EQ(read_bytes(out_dir() / "metrics.json"), metrics);
  EXPECT_EQ(entries(scratch_.path()), (std::set<std::string>{"in", "out"}));
}

}  // namespace
}  // namespace epmoe
