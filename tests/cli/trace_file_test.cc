// trace_file= end to end (core/trace_recorder.h). Topology: ranks as threads
// in one `epmoe layer` process (transport=threads), R = 1, 2, 3;
// clock=wall (no link emulation) and clock=modelled on the h100 preset's
// links (switched, 450 GB/s per GPU each way, link_latency_us default).
//  * The file is JSON; every event has name, ph, ts, pid, tid (ph X: dur >= 0);
//    complete events nest per (pid, tid) track.
//  * clock=modelled: per rank, the durations of the "phase" events of each
//    name sum to metrics.json's expert_parallel.per_rank[r].phase_seconds of
//    that name within 1e-9 relative (both are the same picosecond values,
//    printed through doubles), and there is no phase event the metrics lack.
//  * `epmoe train ... trace_file=` (2 ranks, 3 steps, both clocks): the same
//    structure.
// threads=1: one compute thread per rank.
#include <cmath>
#include <map>
#include <string>

#include "modelled_cli_fixture.h"
#include "train_cli_fixture.h"

namespace epmoe::testing {
namespace {

class TraceFile : public ModelledCli {};

void expect_phase_sums_match(const nlohmann::json& events, const nlohmann::json& metrics, int num_ranks,
                             const std::string& what) {
  std::map<int, std::map<std::string, double>> traced_us;  // [pid][phase]
  for (const nlohmann::json& e : events) {
    if (e.value("ph", "") != "X" || e.value("cat", "") != "phase") continue;
    traced_us[e.at("pid").get<int>()][e.at("name").get<std::string>()] += e.at("dur").get<double>();
  }
  for (int r = 0; r < num_ranks; ++r) {
    const nlohmann::json& phases = rank_report(metrics, r).at("phase_seconds");
    ASSERT_FALSE(phases.empty()) << what;
    for (const auto& [name, seconds_json] : phases.items()) {
      const double seconds = seconds_json.get<double>();
      const double traced = traced_us[r][name] * 1e-6;
      EXPECT_LE(std::abs(traced - seconds), 1e-9 * std::max(std::abs(seconds), 1e-15))
          << what << " rank " << r << " phase " << name << ": trace " << traced << " s, metrics " << seconds << " s";
    }
    for (const auto& [name, us] : traced_us[r]) {
      EXPECT_TRUE(phases.contains(name)) << what << " rank " << r << ": traced phase " << name << " not in metrics";
    }
  }
}

TEST_F(TraceFile, LayerTraceIsWellFormedAndPhasesMatchTheMetricsInModelledTime) {
  const std::filesystem::path in = dir("in");
  generate(in, {.tokens = 96, .hidden = 16, .ffn = 24, .experts = 6});
  for (const std::string dispatch : {"alltoall", "ring"})
    for (const std::string clock : {"wall", "modelled"})
      for (int ranks : {1, 2, 3}) {
        const std::string what = "dispatch=" + dispatch + " clock=" + clock + " ranks=" + std::to_string(ranks);
        const std::filesystem::path trace = dir("trace_" + dispatch + clock + std::to_string(ranks) + ".json");
        const nlohmann::json metrics =
            layer_metrics(in, {"ranks=" + std::to_string(ranks), "dispatch=" + dispatch, "token_chunks=2",
                               "clock=" + clock, "trace_file=" + trace.string()});
        ASSERT_FALSE(metrics.is_null()) << what;
        ASSERT_TRUE(std::filesystem::exists(trace)) << what;
        EXPECT_FALSE(std::filesystem::exists(trace.string() + ".tmp")) << what;
        // Modelled microseconds are picoseconds·1e-6 (< 1e3 us here): 1e-6 us
        // is far above their rounding. Wall: microseconds since the recorder
        // started, printed to 15 digits.
        const nlohmann::json events = check_trace_structure(trace, 1e-6, what);
        std::map<int, int> phase_events;
        for (const nlohmann::json& e : events)
          if (e.value("cat", "") == "phase") ++phase_events[e.at("pid").get<int>()];
        EXPECT_EQ(static_cast<int>(phase_events.size()), ranks) << what << ": one process per rank with phases";
        if (clock == "modelled") {
          ASSERT_TRUE(metrics.contains("modelled")) << what;
          expect_phase_sums_match(events, metrics, ranks, what);
        }
      }
}

TEST_F(TraceFile, TrainTraceIsWellFormed) {
  {
    const ProcessResult help = run_epmoe(scratch_, {"train", "--help"});
    if (help.stdout_text.find("trace_file") == std::string::npos) GTEST_SKIP() << "epmoe train has no trace_file= yet";
  }
  for (const std::string clock : {"wall", "modelled"}) {
    const std::filesystem::path trace = dir("train_" + clock + ".json");
    std::vector<std::string> arguments = {"train", "threads=1", "ranks=2"};
    for (const std::string& key : tiny_train_keys(dir("metrics_" + clock + ".jsonl"))) {
      if (key.rfind("steps=", 0) == 0 || key.rfind("warmup_steps=", 0) == 0) continue;
      arguments.push_back(key);
    }
    for (const std::string key : {"steps=3", "warmup_steps=1"}) arguments.push_back(key);
    arguments.push_back("clock=" + clock);
    arguments.push_back("trace_file=" + trace.string());
    const ProcessResult result = run_epmoe(scratch_, arguments);
    ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
    const nlohmann::json events = check_trace_structure(trace, 1e-6, "train clock=" + clock);
    std::map<int, int> phase_events;
    for (const nlohmann::json& e : events)
      if (e.value("cat", "") == "phase") ++phase_events[e.at("pid").get<int>()];
    EXPECT_EQ(phase_events.size(), 2u) << "train clock=" << clock;
  }
}

}  // namespace
}  // namespace epmoe::testing
