// `epmoe train`'s default balance (issue 31 item 4): balance=dynamic with
// redundant_slots=2, priced, and replica_planning=forecast, where a step
// looks for replicas only when a priced plan on the previous step's counts
// (which the trainer gathers anyway) places some. A run whose replicas never
// pay must then cost exactly what balance=off costs in modelled time, step
// by step, to the picosecond, with the same losses bit for bit; the exact
// same-step planning pays a counts round on the steps it looks.
//
// Topology: ranks as threads (transport=threads), R = 4, threads=1; the tiny
// model of train_cli_fixture.h (V=64 H=32 F=32 E=8 K=2 L=2, 8 x 16 tokens,
// 20 steps) on clock=modelled hardware=h100: its experts are so small that
// a row's compute never pays for a slot's weights.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "train_cli_fixture.h"

namespace epmoe::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kCountsRound[] = "moe/forward/ring_all_gather replica counts";

class TrainBalance : public EpmoeCli {
 protected:
  // The run's metrics lines: `epmoe train` with the tiny model on the
  // modelled clock, then `keys`.
  std::vector<nlohmann::json> modelled_run(const std::string& name, const std::vector<std::string>& keys) {
    const fs::path metrics = scratch_ / name / "metrics.jsonl";
    std::vector<std::string> arguments = {"train", "threads=1", "ranks=4", "clock=modelled", "hardware=h100"};
    for (const std::string& key : tiny_train_keys(metrics)) arguments.push_back(key);
    arguments.insert(arguments.end(), keys.begin(), keys.end());
    const ProcessResult result = run_epmoe(scratch_, arguments);
    EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
    return read_metrics_lines(metrics);
  }
};

std::vector<double> step_seconds_of(const std::vector<nlohmann::json>& lines) {
  std::vector<double> seconds;
  for (const nlohmann::json& line : lines) seconds.push_back(line.at("step_seconds").get<double>());
  return seconds;
}

std::int64_t counts_round_bytes(const nlohmann::json& line) {
  return line.at("bytes_sent").value(kCountsRound, std::int64_t{0});
}

TEST_F(TrainBalance, TheDefaultCostsARunWhoseReplicasDoNotPayNothing) {
  const std::vector<nlohmann::json> off = modelled_run("off", {"balance=off"});
  // The default balance keys, spelled out so that this test holds them.
  const std::vector<nlohmann::json> forecast =
      modelled_run("forecast", {"balance=dynamic", "redundant_slots=2", "replica_planning=forecast"});
  const std::vector<nlohmann::json> defaults = modelled_run("defaults", {});
  ASSERT_EQ(off.size(), 20u);
  ASSERT_EQ(forecast.size(), 20u);
  EXPECT_EQ(losses_of(forecast), losses_of(off));
  EXPECT_EQ(step_seconds_of(forecast), step_seconds_of(off));  // every step, to the picosecond
  for (const nlohmann::json& line : forecast) EXPECT_EQ(counts_round_bytes(line), 0) << line.at("step");
  // No key given: the same run as the spelled-out default.
  EXPECT_EQ(losses_of(defaults), losses_of(forecast));
  EXPECT_EQ(step_seconds_of(defaults), step_seconds_of(forecast));

  // The exact same-step planning looks at step 0 (and after each spell of
  // skipped steps): a counts round that step 0 pays in time, for the same
  // refused plans and the same losses.
  const std::vector<nlohmann::json> exact =
      modelled_run("exact", {"balance=dynamic", "redundant_slots=2", "replica_planning=exact"});
  ASSERT_EQ(exact.size(), 20u);
  EXPECT_EQ(losses_of(exact), losses_of(off));
  EXPECT_GT(counts_round_bytes(exact[0]), 0);
  EXPECT_GT(exact[0].at("step_seconds").get<double>(), off[0].at("step_seconds").get<double>());

  // Each line carries the cost model's verdict per layer: step 0's exact
  // plans were priced at h100's rates and refused replicas whose cost
  // exceeded their saving, placing none (no predicted saving); the
  // forecast's steps after a refused forecast made no plan at all.
  for (const nlohmann::json& verdict : exact[0].at("replica_verdicts")) {
    EXPECT_FALSE(verdict.at("skipped_planning").get<bool>());
    EXPECT_EQ(verdict.at("predicted_saving_us").get<double>(), 0.0);
    EXPECT_GT(verdict.at("refused_replicas").get<int>(), 0);
    EXPECT_GT(verdict.at("refused_cost_us").get<double>(), verdict.at("refused_saving_us").get<double>());
    EXPECT_GT(verdict.at("priced_at").at("compute_gflops").get<double>(), 0.0);
  }
  for (std::size_t i = 1; i < forecast.size(); ++i) {
    for (const nlohmann::json& verdict : forecast[i].at("replica_verdicts"))
      EXPECT_TRUE(verdict.at("skipped_planning").get<bool>()) << forecast[i].at("step");
  }
}

// Where the forecast places replicas (replica_costs=off: balance whatever it
// costs), the steps after the first look and plan on their own counts: the
// counts round runs, replicas compute, and the losses stay those of
// balance=off within fp32 rounding (replicas change where experts compute,
// not what). The first step has no forecast and goes home.
TEST_F(TrainBalance, AForecastThatPlacesReplicasLooksOnTheNextStep) {
  const std::vector<nlohmann::json> off = modelled_run("off", {"balance=off"});
  const std::vector<nlohmann::json> balanced = modelled_run(
      "balanced", {"balance=dynamic", "redundant_slots=2", "replica_costs=off", "rebalance_threshold=1.0"});
  ASSERT_EQ(balanced.size(), 20u);
  EXPECT_LT(max_relative_difference(losses_of(balanced), losses_of(off)), 1e-5);
  EXPECT_EQ(counts_round_bytes(balanced[0]), 0);
  int looked = 0;
  for (std::size_t i = 1; i < balanced.size(); ++i) looked += counts_round_bytes(balanced[i]) > 0 ? 1 : 0;
  EXPECT_GT(looked, 10) << "of 19 steps";
  // Each line says how many replicas its step placed, per layer: none at
  // step 0 (no forecast) and none with balance=off; some on a step that
  // looked and then moved replica weights.
  const auto replicas_of = [](const nlohmann::json& line) {
    int sum = 0;
    for (const nlohmann::json& layer : line.at("replicas")) sum += layer.get<int>();
    return sum;
  };
  EXPECT_EQ(replicas_of(balanced[0]), 0);
  for (const nlohmann::json& line : off) EXPECT_EQ(replicas_of(line), 0) << line.at("step");
  for (const nlohmann::json& line : balanced) {
    const bool moved = line.at("bytes_sent").value("moe/forward/replica weights", std::int64_t{0}) > 0;
    EXPECT_EQ(replicas_of(line) > 0, moved) << line.at("step");
  }
  // The per-rank loads after balancing are the plan's where a layer placed
  // replicas (the balance plan, replica_costs=off, lowers them), and the
  // at-home loads where it placed none.
  int lowered = 0;
  for (const std::vector<nlohmann::json>* run : {&off, &balanced}) {
    for (const nlohmann::json& line : *run) {
      const auto& before = line.at("rank_load_max_over_mean_before");
      const auto& after = line.at("rank_load_max_over_mean_after");
      ASSERT_EQ(after.size(), before.size());
      for (std::size_t l = 0; l < after.size(); ++l) {
        if (line.at("replicas")[l].get<int>() == 0) {
          EXPECT_EQ(after[l], before[l]) << line.at("step") << " layer " << l;
        } else {
          EXPECT_GE(after[l].get<double>(), 1.0);
          EXPECT_LE(after[l].get<double>(), before[l].get<double>()) << line.at("step") << " layer " << l;
          lowered += after[l].get<double>() < before[l].get<double>() ? 1 : 0;
        }
      }
    }
  }
  EXPECT_GT(lowered, 10) << "(step, layer) pairs whose plan lowered the busiest rank's load";
}

// replica_costs=measured on the wall clock: step 0 has no forecast and goes
// home; its forecast, with no rates yet, looks; step 1's plan measures the
// rates (the probe's bytes) and prices at them; no later step measures
// again. What the rates are, and so which replicas later steps place,
// depends on the machine's timing and is not asserted; the losses stay those
// of balance=off within fp32 rounding whatever is placed.
TEST_F(TrainBalance, MeasuredRatesAreMeasuredOnceByTheFirstPlan) {
  const auto wall_run = [&](const std::string& name, const std::vector<std::string>& keys) {
    const fs::path metrics = scratch_ / name / "metrics.jsonl";
    std::vector<std::string> arguments = {"train", "threads=1", "ranks=4"};
    for (const std::string& key : tiny_train_keys(metrics)) arguments.push_back(key);
    arguments.insert(arguments.end(), keys.begin(), keys.end());
    const ProcessResult result = run_epmoe(scratch_, arguments);
    EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
    return read_metrics_lines(metrics);
  };
  const std::vector<nlohmann::json> off = wall_run("off", {"balance=off"});
  const std::vector<nlohmann::json> measured = wall_run("measured", {"replica_costs=measured"});
  ASSERT_EQ(measured.size(), 20u);
  for (std::size_t i = 0; i < measured.size(); ++i) {
    const std::int64_t probe = measured[i].at("bytes_sent").value("moe/forward/replica rate probe", std::int64_t{0});
    if (i == 1) {
      EXPECT_GT(probe, 0) << "step 1 plans first";
    } else {
      EXPECT_EQ(probe, 0) << "step " << i;
    }
  }
  EXPECT_GT(counts_round_bytes(measured[1]), 0);
  EXPECT_LT(max_relative_difference(losses_of(measured), losses_of(off)), 1e-5);
}

}  // namespace
}  // namespace epmoe::testing
