// `epmoe balance` end to end, the built binary run as a subprocess:
// --generate writes reproducible int64 [steps, E] loads; --loads replays every
// policy and reports sane figures (none moves nothing, dynamic beats none);
// bad input fails with exit code 2 and one line naming the file or key.
// Loads: E = 16 experts, R = 4 ranks, 128 tokens per rank, K = 2, 30 steps.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/epmoe_cli_fixture.h"
#include "core/tensor.h"
#include "data/npy.h"

namespace epmoe::testing {
namespace {

class BalanceCli : public ::testing::Test {
 protected:
  std::filesystem::path loads_file() const { return scratch_ / "loads.npy"; }

  ProcessResult generate(const std::filesystem::path& file, std::vector<std::string> extra = {}) {
    std::vector<std::string> arguments = {"balance",     "--generate",        file.string(), "experts=16", "ranks=4",
                                          "tokens_per_rank=128", "top_k=2", "steps=30",     "placement=packed"};
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
  EXPECT_LT(by_policy["dynamic"]["mean_max_over_mean"].get<double>(), by_policy["none"]["mean_max_over_mean"].get<double>());
  for (const auto& [name, row] : by_policy) {
    EXPECT_GE(row["worst_max_over_mean"].get<double>(), row["mean_max_over_mean"].get<double>()) << name;
    // Bytes are moves x 3*H*F*4 = moves x 384.
    EXPECT_DOUBLE_EQ(row["mean_weight_bytes_moved_per_step"].get<double>(),
                     row["mean_expert_moves_per_step"].get<double>() * 384.0) << name;
  }
  // The text table names every policy too.
  const ProcessResult table = replay({"ranks=4"});
  ASSERT_EQ(table.exit_code, 0) << table.stderr_text;
  for (const char* name : {"none", "eplb", "dynamic", "hybrid"}) {
    EXPECT_NE(table.stdout_text.find(name), std::string::npos) << table.stdout_text;
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

}  // namespace
}  // namespace epmoe::testing
