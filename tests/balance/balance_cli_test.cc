// `epmoe balance` end to end, the built binary run as a subprocess:
// --generate writes reproducible int64 [steps, E] loads; --loads replays every
// policy and reports sane figures (none moves nothing, dynamic beats none);
// bad input fails with exit code 2 and one line naming the file or key.
// --json carries every step's plan (copies and weight moves), and a training
// run's metrics.jsonl replays like the .npy of its expert counts.
// Loads: E = 16 experts, R = 4 ranks, 128 tokens per rank, K = 2, 30 steps.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/epmoe_cli_fixture.h"
#include "cli/train_cli_fixture.h"
#include "core/tensor.h"
#include "data/npy.h"

namespace epmoe::testing {
namespace {

class BalanceCli : public ::testing::Test {
 protected:
  std::filesystem::path loads_file() const { return scratch_ / "loads.npy"; }

  ProcessResult generate(const std::filesystem::path& file, std::vector<std::string> extra = {}) {
    std::vector<std::string> arguments = {"balance",    "--generate", file.string(),
                                          "experts=16", "ranks=4",    "tokens_per_rank=128",
                                          "top_k=2",    "steps=30",   "placement=packed"};
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    return run_epmoe(scratch_, arguments);
  }

  ProcessResult replay(std::vector<std::string> keys) {
    std::vector<std::string> arguments = {"balance", "--loads", loads_file().string()};
    arguments.insert(arguments.end(), keys.begin(), keys.end());
    return run_epmoe(scratch_, arguments);
  }

  static void expect_one_line_error(const ProcessResult& result, const std::vector<std::string>& fragments) {
    EXPECT_EQ(result.exit_code, 2) << result.stderr_text;
    EXPECT_EQ(result.stderr_text.rfind("epmoe: error: ", 0), 0u) << result.stderr_text;
    EXPECT_EQ(result.stderr_text.find('\n'), result.stderr_text.size() - 1) << result.stderr_text;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(result.stderr_text.find(fragment), std::string::npos) << result.stderr_text << "missing: " << fragment;
    }
  }

  ScratchDir scratch_;
};

TEST_F(BalanceCli, GeneratesReproducibleInt64Loads) {
  ASSERT_EQ(generate(loads_file(), {"seed=5"}).exit_code, 0);
  ASSERT_EQ(generate(scratch_ / "again.npy", {"seed=5"}).exit_code, 0);
  ASSERT_EQ(generate(scratch_ / "other.npy", {"seed=6"}).exit_code, 0);
  const Tensor loads = read_npy(loads_file(), DType::i64);
  EXPECT_EQ(loads.shape(), (Shape{30, 16}));
  EXPECT_EQ(read_bytes(loads_file()), read_bytes(scratch_ / "again.npy"));
  EXPECT_NE(read_bytes(loads_file()), read_bytes(scratch_ / "other.npy"));
  std::int64_t step0 = 0;
  for (int e = 0; e < 16; ++e) step0 += loads.data<std::int64_t>()[e];
  EXPECT_EQ(step0, 4 * 128 * 2);
}

TEST_F(BalanceCli, ReplaysEveryPolicyAsJson) {
  ASSERT_EQ(generate(loads_file()).exit_code, 0);
  const ProcessResult result = replay({"ranks=4", "slots=2", "window=10", "period=10", "hidden=8", "ffn=4", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  const nlohmann::json report = nlohmann::json::parse(result.stdout_text);
  EXPECT_EQ(report["num_steps"], 30);
  EXPECT_EQ(report["num_experts"], 16);
  ASSERT_EQ(report["policies"].size(), 4u);
  std::map<std::string, nlohmann::json> by_policy;
  for (const auto& row : report["policies"]) by_policy[row["policy"].get<std::string>()] = row;
  ASSERT_EQ(by_policy.size(), 4u);
  EXPECT_EQ(by_policy["none"]["mean_expert_moves_per_step"], 0.0);
  // Packed hot experts: max/mean well above 1 without balancing.
  EXPECT_GT(by_policy["none"]["mean_max_over_mean"].get<double>(), 1.5);
  EXPECT_LT(by_policy["dynamic"]["mean_max_over_mean"].get<double>(),
            by_policy["none"]["mean_max_over_mean"].get<double>());
  for (const auto& [name, row] : by_policy) {
    EXPECT_GE(row["worst_max_over_mean"].get<double>(), row["mean_max_over_mean"].get<double>()) << name;
    // Bytes are moves x 3*H*F*4 = moves x 384.
    EXPECT_DOUBLE_EQ(row["mean_weight_bytes_moved_per_step"].get<double>(),
                     row["mean_expert_moves_per_step"].get<double>() * 384.0)
        << name;
  }
  // The text table names every policy too.
  const ProcessResult table = replay({"ranks=4"});
  ASSERT_EQ(table.exit_code, 0) << table.stderr_text;
  for (const char* name : {"none", "eplb", "dynamic", "hybrid"}) {
    EXPECT_NE(table.stdout_text.find(name), std::string::npos) << table.stdout_text;
  }
}

TEST_F(BalanceCli, AHugeRebalanceThresholdMeansNoReplicas) {
  // max/mean never exceeds R, so a threshold of R or more (1e18, 1e300) never
  // rebalances; it once sent the planner into an endless loop. The deadline
  // turns a hang into a failure (the replay itself takes milliseconds).
  ASSERT_EQ(generate(loads_file()).exit_code, 0);
  for (const char* threshold : {"rebalance_threshold=1e18", "rebalance_threshold=1e300"}) {
    const ProcessResult result = run_program(scratch_,
                                             {EPMOE_BINARY, "balance", "--loads", loads_file().string(), "ranks=4",
                                              "slots=1", "policy=dynamic", threshold, "plans=false", "--json"},
                                             std::chrono::seconds(60));
    ASSERT_EQ(result.exit_code, 0) << threshold << ": " << result.stderr_text;
    const nlohmann::json dynamic = nlohmann::json::parse(result.stdout_text)["policies"].at(0);
    EXPECT_EQ(dynamic["mean_active_replicas"], 0.0) << threshold;
    EXPECT_EQ(dynamic["mean_expert_moves_per_step"], 0.0) << threshold;
  }
}

TEST_F(BalanceCli, RejectsBadInputWithOneLine) {
  expect_one_line_error(replay({"ranks=4"}), {"loads.npy"});  // missing file
  ASSERT_EQ(generate(loads_file()).exit_code, 0);
  expect_one_line_error(replay({"ranks=3"}), {"ranks=3", "16 experts"});
  expect_one_line_error(replay({"ranks=4", "policy=greedy"}), {"policy"});
  expect_one_line_error(replay({"ranks=4", "zipf=1.1"}), {"zipf"});  // a --generate key
  expect_one_line_error(run_epmoe(scratch_, {"balance", "ranks=4"}), {"--loads", "--generate"});
  expect_one_line_error(generate(scratch_ / "x.npy", {"experts=18"}), {"experts=18", "ranks=4"});

  Tensor floats(DType::f32, {3, 16});
  floats.fill_zero();
  write_npy(scratch_ / "floats.npy", floats);
  expect_one_line_error(run_epmoe(scratch_, {"balance", "--loads", (scratch_ / "floats.npy").string(), "ranks=4"}),
                        {"floats.npy", "<f4"});
  Tensor flat = Tensor::zeros(DType::i64, {16});
  write_npy(scratch_ / "flat.npy", flat);
  expect_one_line_error(run_epmoe(scratch_, {"balance", "--loads", (scratch_ / "flat.npy").string(), "ranks=4"}),
                        {"flat.npy"});
  Tensor negative = Tensor::zeros(DType::i64, {2, 4});
  negative.data<std::int64_t>()[5] = -1;
  write_npy(scratch_ / "negative.npy", negative);
  expect_one_line_error(run_epmoe(scratch_, {"balance", "--loads", (scratch_ / "negative.npy").string(), "ranks=4"}),
                        {"negative.npy", "loads[1, 1] = -1"});
}

TEST_F(BalanceCli, AnOptionWhereAFileNameBelongsIsRefused) {
  // CLI11 takes the next word as an option's value: `--generate --help` once
  // wrote a file named "--help" (in the working directory) and exited 0.
  const std::filesystem::path stray = std::filesystem::current_path() / "--help";
  expect_one_line_error(run_epmoe(scratch_, {"balance", "--generate", "--help"}), {"--generate", "'--help'"});
  EXPECT_FALSE(std::filesystem::exists(stray));
  std::filesystem::remove(stray);
  expect_one_line_error(run_epmoe(scratch_, {"balance", "--loads", "--json", "ranks=4"}), {"--loads", "'--json'"});
  ASSERT_EQ(generate(loads_file()).exit_code, 0);
  expect_one_line_error(replay({"ranks=4", "--report", "-r.html"}), {"--report", "'-r.html'", "./-r.html"});
}

// Every step of every policy: quotas summing to the step's loads per expert,
// at most one copy of an expert per rank, and moves that are exactly the
// (rank, expert) pairs held in this step and not in the one before (before
// step 0: the homes, E/R consecutive experts per rank).
void expect_plans_match_loads(const nlohmann::json& policies, const std::vector<std::vector<std::int64_t>>& loads,
                              int num_ranks) {
  const int num_experts = static_cast<int>(loads.at(0).size());
  for (const nlohmann::json& policy : policies) {
    const std::string name = policy.at("policy").get<std::string>();
    ASSERT_EQ(policy.at("steps").size(), loads.size()) << name;
    std::set<std::pair<int, int>> held_before;
    for (int e = 0; e < num_experts; ++e) held_before.insert({e / (num_experts / num_ranks), e});
    double moves_sum = 0;
    for (std::size_t s = 0; s < loads.size(); ++s) {
      const nlohmann::json& step = policy["steps"][s];
      EXPECT_EQ(step.at("step"), s) << name;
      std::vector<std::int64_t> quota_sum(static_cast<std::size_t>(num_experts), 0);
      std::set<std::pair<int, int>> held;
      for (const nlohmann::json& copy : step.at("copies")) {
        ASSERT_EQ(copy.size(), 3u);
        const int expert = copy[0].get<int>(), rank = copy[1].get<int>();
        ASSERT_TRUE(expert >= 0 && expert < num_experts && rank >= 0 && rank < num_ranks) << copy;
        EXPECT_GE(copy[2].get<std::int64_t>(), 0);
        quota_sum[static_cast<std::size_t>(expert)] += copy[2].get<std::int64_t>();
        EXPECT_TRUE(held.insert({rank, expert}).second) << name << " step " << s << ": two copies " << copy;
      }
      EXPECT_EQ(quota_sum, loads[s]) << name << " step " << s;
      EXPECT_EQ(step.at("active_replicas").get<int>(), static_cast<int>(held.size()) - num_experts) << name;
      nlohmann::json expected_moves = nlohmann::json::array();
      for (const auto& [rank, expert] : held) {
        if (!held_before.count({rank, expert})) expected_moves.push_back({rank, expert});
      }
      EXPECT_EQ(step.at("moves"), expected_moves) << name << " step " << s;
      EXPECT_EQ(step.at("expert_moves").get<int>(), static_cast<int>(step["moves"].size())) << name;
      moves_sum += step["expert_moves"].get<double>();
      held_before = std::move(held);
    }
    EXPECT_DOUBLE_EQ(policy.at("mean_expert_moves_per_step").get<double>(), moves_sum / loads.size()) << name;
  }
}

std::vector<std::vector<std::int64_t>> rows_of(const Tensor& loads) {
  std::vector<std::vector<std::int64_t>> rows;
  for (std::int64_t s = 0; s < loads.dim(0); ++s) {
    const std::int64_t* row = loads.data<std::int64_t>() + s * loads.dim(1);
    rows.emplace_back(row, row + loads.dim(1));
  }
  return rows;
}

TEST_F(BalanceCli, JsonCarriesEveryStepsCopiesAndMoves) {
  ASSERT_EQ(generate(loads_file(), {"drift=rotate", "drift_interval=7"}).exit_code, 0);
  const ProcessResult result = replay({"ranks=4", "slots=2", "window=10", "period=10", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  const nlohmann::json report = nlohmann::json::parse(result.stdout_text);
  EXPECT_EQ(report["source"], "npy");
  ASSERT_EQ(report["policies"].size(), 4u);
  expect_plans_match_loads(report["policies"], rows_of(read_npy(loads_file(), DType::i64)), 4);
  for (const nlohmann::json& policy : report["policies"]) {
    if (policy["policy"] == "none") {
      EXPECT_EQ(policy["max_expert_moves_in_a_step"], 0);
    }
    if (policy["policy"] == "eplb") {  // its first placement, at step P = 10
      EXPECT_GT(policy["steps"][10]["expert_moves"].get<int>(), 0);
    }
  }
  // plans=false: the summary alone, the same figures.
  const ProcessResult summary = replay({"ranks=4", "slots=2", "window=10", "period=10", "plans=false", "--json"});
  ASSERT_EQ(summary.exit_code, 0) << summary.stderr_text;
  const nlohmann::json brief = nlohmann::json::parse(summary.stdout_text);
  ASSERT_EQ(brief["policies"].size(), 4u);
  for (std::size_t p = 0; p < 4; ++p) {
    EXPECT_FALSE(brief["policies"][p].contains("steps"));
    nlohmann::json full = report["policies"][p];
    full.erase("steps");
    EXPECT_EQ(brief["policies"][p], full);
  }
}

// `epmoe train` for 3 steps of the tiny model on 2 ranks; its metrics file.
std::filesystem::path train_three_steps(const ScratchDir& scratch) {
  const std::filesystem::path metrics = scratch / "run" / "metrics.jsonl";
  std::vector<std::string> arguments = {"train", "ranks=2"};
  for (std::string key : tiny_train_keys(metrics)) arguments.push_back(key == "steps=20" ? "steps=3" : key);
  const ProcessResult result = run_epmoe(scratch, arguments);
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
  return metrics;
}

TEST_F(BalanceCli, ReplaysATrainingRunsMetricsLikeTheNpyOfItsCounts) {
  const std::filesystem::path metrics = train_three_steps(scratch_);
  const std::vector<nlohmann::json> lines = read_metrics_lines(metrics);
  ASSERT_EQ(lines.size(), 3u);
  // Every line: expert_counts [L=2][E=8], each layer's counts summing to the
  // step's N*K = 8*16*2 pairs.
  for (const nlohmann::json& line : lines) {
    ASSERT_EQ(line.at("expert_counts").size(), 2u);
    for (const nlohmann::json& layer : line["expert_counts"]) {
      ASSERT_EQ(layer.size(), 8u);
      std::int64_t sum = 0;
      for (const nlohmann::json& count : layer) sum += count.get<std::int64_t>();
      EXPECT_EQ(sum, 8 * 16 * 2);
    }
  }
  const std::vector<std::string> keys = {"ranks=4", "slots=1", "window=1", "period=1", "rebalance_threshold=1.0",
                                         "--json"};
  std::vector<std::string> arguments = {"balance", "--loads", metrics.string()};
  arguments.insert(arguments.end(), keys.begin(), keys.end());
  const ProcessResult from_metrics = run_epmoe(scratch_, arguments);
  ASSERT_EQ(from_metrics.exit_code, 0) << from_metrics.stderr_text;
  const nlohmann::json report = nlohmann::json::parse(from_metrics.stdout_text);
  EXPECT_EQ(report["source"], "metrics");
  EXPECT_EQ(report["num_layers"], 2);
  EXPECT_EQ(report["num_steps"], 3);
  EXPECT_EQ(report["num_experts"], 8);
  ASSERT_EQ(report["layers"].size(), 2u);
  for (int l = 0; l < 2; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const nlohmann::json& layer = report["layers"][l];
    EXPECT_EQ(layer["layer"], l);
    // The same counts as an .npy [3, 8] give the same numbers, plans included.
    Tensor loads(DType::i64, {3, 8});
    for (int s = 0; s < 3; ++s) {
      for (int e = 0; e < 8; ++e)
        loads.data<std::int64_t>()[s * 8 + e] = lines[s]["expert_counts"][l][e].get<std::int64_t>();
    }
    const std::filesystem::path npy = scratch_ / ("layer" + std::to_string(l) + ".npy");
    write_npy(npy, loads);
    arguments[2] = npy.string();
    const ProcessResult from_npy = run_epmoe(scratch_, arguments);
    ASSERT_EQ(from_npy.exit_code, 0) << from_npy.stderr_text;
    nlohmann::json policies = layer["policies"];
    for (nlohmann::json& policy : policies) {
      for (nlohmann::json& step : policy["steps"]) {
        EXPECT_EQ(step["train_step"], step["step"].get<int>() + 1);
        step.erase("train_step");
      }
    }
    EXPECT_EQ(policies, nlohmann::json::parse(from_npy.stdout_text)["policies"]);
    expect_plans_match_loads(layer["policies"], rows_of(loads), 4);
  }
  // layer=1 alone: that layer's entry; the text table labels each layer.
  arguments[2] = metrics.string();
  arguments.push_back("layer=1");
  const ProcessResult one = run_epmoe(scratch_, arguments);
  ASSERT_EQ(one.exit_code, 0) << one.stderr_text;
  const nlohmann::json one_report = nlohmann::json::parse(one.stdout_text);
  ASSERT_EQ(one_report["layers"].size(), 1u);
  EXPECT_EQ(one_report["layers"][0], report["layers"][1]);
  const ProcessResult table = run_epmoe(scratch_, {"balance", "--loads", metrics.string(), "ranks=4"});
  ASSERT_EQ(table.exit_code, 0) << table.stderr_text;
  EXPECT_NE(table.stdout_text.find("layer 0\n"), std::string::npos) << table.stdout_text;
  EXPECT_NE(table.stdout_text.find("layer 1\n"), std::string::npos) << table.stdout_text;
}

TEST_F(BalanceCli, AStepOnSeveralLinesTakesItsLastLine) {
  const std::filesystem::path file = scratch_ / "twice.jsonl";
  write_bytes(file,
              "{\"step\": 1, \"expert_counts\": [[1, 2, 3, 4]]}\n"
              "{\"step\": 2, \"expert_counts\": [[9, 0, 0, 0]]}\n"
              "{\"step\": 3, \"expert_counts\": [[0, 0, 5, 5]]}\n"
              "{\"step\": 2, \"expert_counts\": [[2, 2, 2, 2]]}\n"
              "\n");
  const ProcessResult result =
      run_epmoe(scratch_, {"balance", "--loads", file.string(), "ranks=2", "policy=none", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  const nlohmann::json report = nlohmann::json::parse(result.stdout_text);
  EXPECT_EQ(report["superseded_lines"], 1);
  EXPECT_EQ(report["num_steps"], 3);
  expect_plans_match_loads(report["layers"][0]["policies"], {{1, 2, 3, 4}, {2, 2, 2, 2}, {0, 0, 5, 5}}, 2);
}

TEST_F(BalanceCli, RejectsBadMetricsFilesNamingTheLine) {
  const std::filesystem::path metrics = train_three_steps(scratch_);
  const std::vector<nlohmann::json> lines = read_metrics_lines(metrics);
  ASSERT_EQ(lines.size(), 3u);
  const auto write_lines = [&](const std::string& name, const std::vector<nlohmann::json>& records,
                               const std::string& extra = "") {
    std::string text;
    for (const nlohmann::json& record : records) text += record.dump() + "\n";
    write_bytes(scratch_ / name, text + extra);
    return (scratch_ / name).string();
  };
  const auto balance = [&](const std::string& file, std::vector<std::string> keys = {"ranks=4"}) {
    std::vector<std::string> arguments = {"balance", "--loads", file};
    arguments.insert(arguments.end(), keys.begin(), keys.end());
    return run_epmoe(scratch_, arguments);
  };
  // A torn line (a killed run).
  expect_one_line_error(balance(write_lines("torn.jsonl", {lines[0], lines[1]}, "{\"step\": 3, \"lo")),
                        {"torn.jsonl:3:", "not JSON"});
  // A metrics file of an older epmoe: no expert_counts.
  std::vector<nlohmann::json> old = lines;
  for (nlohmann::json& line : old) line.erase("expert_counts");
  expect_one_line_error(balance(write_lines("old.jsonl", old)),
                        {"old.jsonl:1:", "no \"expert_counts\"", "older epmoe"});
  // Layers, then experts, differing between lines.
  std::vector<nlohmann::json> layers = lines;
  layers[1]["expert_counts"].erase(1);
  expect_one_line_error(balance(write_lines("layers.jsonl", layers)), {"layers.jsonl:2:", "1 layers", "first line 2"});
  std::vector<nlohmann::json> experts = lines;
  experts[2]["expert_counts"][1].push_back(0);
  expect_one_line_error(balance(write_lines("experts.jsonl", experts)),
                        {"experts.jsonl:3:", "[1] has 9 experts", "first line 8"});
  std::vector<nlohmann::json> negative = lines;
  negative[1]["expert_counts"][0][5] = -3;
  expect_one_line_error(balance(write_lines("negative.jsonl", negative)),
                        {"negative.jsonl:2:", "\"expert_counts\"[0][5] = -3", ">= 0"});
  expect_one_line_error(balance(metrics.string(), {"ranks=4", "layer=2"}), {"layer=2", "metrics.jsonl:1", "2 layers"});
  expect_one_line_error(balance(metrics.string(), {"ranks=4", "layer=x"}), {"layer=x"});
  expect_one_line_error(balance(write_lines("empty.jsonl", {})), {"empty.jsonl", "empty"});
  // layer= names a layer of a metrics file; an .npy has one.
  ASSERT_EQ(generate(loads_file()).exit_code, 0);
  expect_one_line_error(replay({"ranks=4", "layer=0"}), {"layer=0", "loads.npy", "only a metrics.jsonl"});
}

}  // namespace
}  // namespace epmoe::testing
