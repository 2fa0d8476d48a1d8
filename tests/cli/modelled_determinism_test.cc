// clock=modelled tells the same story whatever the host does (issue 30):
// identical runs started at once give identical files, the trace is the step
// and shows every data-moving step, and a wait caused by a slow rank's
// compute is that rank's account (idle), however many ranks forward it.
//
// Topology: ranks as threads in one `epmoe` process per run; R = 4 (layer,
// train) and R = 1 (the local dispatcher); small shapes (N = 256, H = 32).
// Compute is modelled, so every time is a function of config and seed.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <set>

#include "modelled_cli_fixture.h"

namespace epmoe::testing {
namespace {

class ModelledDeterminism : public ModelledCli {
 protected:
  // Runs `epmoe <arguments>` kNumRuns times at once, each in its own
  // directory under `base` (run0, run1, ...) as its working directory, so
  // that relative output paths give identical metrics text. Returns the
  // directories; every run must exit 0 before the deadline.
  static constexpr int kNumRuns = 8;
  std::vector<std::filesystem::path> run_concurrently(const std::string& base,
                                                      const std::vector<std::string>& arguments) {
    std::vector<std::filesystem::path> dirs;
    std::vector<pid_t> children;
    for (int i = 0; i < kNumRuns; ++i) {
      dirs.push_back(dir(base) / ("run" + std::to_string(i)));
      std::filesystem::create_directories(dirs.back());
    }
    std::vector<std::string> argv_strings = {EPMOE_BINARY};
    argv_strings.insert(argv_strings.end(), arguments.begin(), arguments.end());
    std::vector<char*> argv;
    for (std::string& a : argv_strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (const std::filesystem::path& d : dirs) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        if (::chdir(d.c_str()) != 0) ::_exit(126);
        const int null = ::open("/dev/null", O_WRONLY);
        ::dup2(null, STDOUT_FILENO);
        ::execv(argv[0], argv.data());
        ::_exit(127);
      }
      children.push_back(pid);
    }
    // A deadline, so that a hang fails the test instead of stalling it.
    const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(3);
    for (const pid_t pid : children) {
      int status = 0;
      while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > end) {
          for (const pid_t p : children) ::kill(p, SIGKILL);
          ::waitpid(pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << base << ": a run failed (status " << status << ")";
    }
    return dirs;
  }
};

// The end of the last event of a trace, in microseconds.
double trace_end_us(const nlohmann::json& events) {
  double end = 0;
  for (const nlohmann::json& e : events)
    if (e.contains("ts")) end = std::max(end, e.at("ts").get<double>() + e.value("dur", 0.0));
  return end;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (std::size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1)
    lines.push_back(text.substr(start, end - start));
  return lines;
}

TEST_F(ModelledDeterminism, EightConcurrentLayerRunsWriteIdenticalFilesAndTheTraceIsTheStep) {
  const std::filesystem::path in = dir("in");
  generate(in, {.tokens = 256, .hidden = 32, .ffn = 48, .experts = 8});
  const std::vector<std::vector<std::string>> configs = {
      {"dispatch=alltoall", "dedup=true", "token_chunks=2", "balance=dynamic", "redundant_slots=1"},
      {"dispatch=ring", "token_chunks=2", "balance=dynamic", "redundant_slots=1", "fp8_tokens=token"}};
  for (std::size_t c = 0; c < configs.size(); ++c) {
    std::vector<std::string> arguments = {"layer",
                                          "--in",
                                          in.string(),
                                          "--out",
                                          "out",
                                          "ranks=4",
                                          "threads=1",
                                          "clock=modelled",
                                          "hardware=tpu-v7x",
                                          "trace_file=trace.json"};
    arguments.insert(arguments.end(), configs[c].begin(), configs[c].end());
    const std::string what = "layer config " + std::to_string(c);
    const std::vector<std::filesystem::path> runs = run_concurrently("layer" + std::to_string(c), arguments);
    const std::string metrics = read_bytes(runs[0] / "out" / "metrics.json");
    const std::string trace = read_bytes(runs[0] / "trace.json");
    for (int i = 1; i < kNumRuns; ++i) {
      EXPECT_EQ(read_bytes(runs[i] / "out" / "metrics.json"), metrics) << what << ": run " << i;
      EXPECT_EQ(read_bytes(runs[i] / "trace.json"), trace) << what << ": run " << i;
    }
    // The step is the whole modelled timeline: set-up before it is not
    // traced, and nothing runs on the links after it.
    const double step_us = nlohmann::json::parse(metrics).at("modelled").at("step_seconds").get<double>() * 1e6;
    EXPECT_NEAR(trace_end_us(nlohmann::json::parse(trace).at("traceEvents")), step_us, 1e-6) << what;
  }
}

// Train: the whole metrics.jsonl, byte for byte (its step_seconds and
// tokens_per_second are the modelled ones), and the trace. The steps are the
// whole modelled timeline of each rank: the per-step metrics exchange (the
// ranks' reports behind each line, run under the next step's forward) is
// neither traced nor on the modelled links, so each rank's trace runs from
// its first forward to exactly the sum of its steps' modelled times.
TEST_F(ModelledDeterminism, EightConcurrentTrainRunsWriteIdenticalFilesAndTheTraceIsTheSteps) {
  for (const std::string dispatch : {"alltoall", "ring"}) {
    const std::vector<std::string> arguments = {"train",
                                                "ranks=4",
                                                "threads=1",
                                                "clock=modelled",
                                                "hardware=h100",
                                                "steps=3",
                                                "num_layers=2",
                                                "hidden=32",
                                                "ffn=48",
                                                "num_experts=8",
                                                "vocab_size=64",
                                                "seq_len=32",
                                                "batch_size=4",
                                                "dispatch=" + dispatch,
                                                "token_chunks=2",
                                                "balance=dynamic",
                                                "redundant_slots=1",
                                                "metrics_file=metrics.jsonl",
                                                "trace_file=trace.json",
                                                "checkpoint_dir=",
                                                "progress=off"};
    const std::vector<std::filesystem::path> runs = run_concurrently("train_" + dispatch, arguments);
    const std::string trace = read_bytes(runs[0] / "trace.json");
    const std::string metrics = read_bytes(runs[0] / "metrics.jsonl");
    const std::vector<std::string> lines = lines_of(metrics);
    ASSERT_EQ(lines.size(), 3u) << dispatch;
    for (int i = 1; i < kNumRuns; ++i) {
      EXPECT_EQ(read_bytes(runs[i] / "trace.json"), trace) << dispatch << ": run " << i;
      EXPECT_EQ(read_bytes(runs[i] / "metrics.jsonl"), metrics) << dispatch << ": run " << i;
    }
    std::vector<double> steps_us(4, 0.0);  // per rank, the sum of its steps' modelled times
    for (const std::string& line : lines) {
      const nlohmann::json record = nlohmann::json::parse(line);
      EXPECT_EQ(record.at("step_seconds"), record.at("modelled").at("step_seconds")) << dispatch;
      EXPECT_EQ(record.at("tokens_per_second"), record.at("modelled").at("tokens_per_second")) << dispatch;
      for (const nlohmann::json& rank : record.at("modelled").at("per_rank"))
        steps_us[rank.at("rank").get<std::size_t>()] +=
            1e6 * (rank.at("forward_seconds").get<double>() + rank.at("backward_seconds").get<double>());
    }
    const nlohmann::json events = nlohmann::json::parse(trace).at("traceEvents");
    // Per rank, its own clock's events (compute, phases, collectives: "X");
    // a message's arrival ("e") is on its receiver's clock.
    std::vector<double> first_forward_us(4, INFINITY), end_us(4, 0.0);
    for (const nlohmann::json& e : events) {
      if (!e.contains("ts")) continue;
      const std::string name = e.value("name", "");
      EXPECT_EQ(name.find("metrics exchange"), std::string::npos) << dispatch << ": traced " << name;
      const auto r = e.at("pid").get<std::size_t>();
      ASSERT_LT(r, 4u) << dispatch;
      const double ts = e.at("ts").get<double>();
      if (name == "forward" && e.value("cat", "") == "phase") first_forward_us[r] = std::min(first_forward_us[r], ts);
      if (e.value("ph", "") == "X") end_us[r] = std::max(end_us[r], ts + e.value("dur", 0.0));
    }
    double last_step_end_us = 0;
    for (std::size_t r = 0; r < 4; ++r) {
      EXPECT_NEAR(end_us[r] - first_forward_us[r], steps_us[r], 1e-5) << dispatch << " rank " << r;
      last_step_end_us = std::max(last_step_end_us, first_forward_us[r] + steps_us[r]);
    }
    // Nothing, messages included, after the last rank's last step.
    EXPECT_NEAR(trace_end_us(events), last_step_end_us, 1e-5) << dispatch;
  }
}

// docs/MODELLED_TIME.md "What advances a clock": the trace's compute track
// names every charged data-moving step of each dispatcher, and its
// collective lanes the conversions a bf16 wire's reduce-scatter charges on
// its own clock.
TEST_F(ModelledDeterminism, TheTraceShowsEveryChargedDataMovement) {
  const std::filesystem::path in = dir("in");
  generate(in, {.tokens = 64, .hidden = 32, .ffn = 48, .experts = 4});
  struct Case {
    std::string what;
    std::vector<std::string> keys;
    std::set<std::string> expected;           // compute events
    std::set<std::string> expected_on_lanes;  // events on the collective lanes
  };
  const std::set<std::string> expert_combine = {"combine weighted sum", "combine backward", "slot dx sum"};
  auto with = [&](std::set<std::string> names) {
    names.insert(expert_combine.begin(), expert_combine.end());
    return names;
  };
  const std::vector<Case> cases = {
      {"alltoall fp8",
       {"ranks=4", "dispatch=alltoall", "fp8_tokens=token"},
       with({"gather rows", "token encode", "token decode", "combine home sum", "pack cotangents"}),
       {}},
      {"ring fp8",
       {"ranks=4", "dispatch=ring", "fp8_tokens=tensor"},
       with({"gather rows", "token encode", "token decode", "unpack rows"}),
       {}},
      {"local", {"ranks=1"}, with({"gather rows", "pack cotangents", "unpack rows"}), {}},
      // Chunks: each chunk's weight gradient is added into the total.
      {"ring chunks",
       {"ranks=4", "dispatch=ring", "token_chunks=2"},
       with({"gather rows", "token encode", "unpack rows", "accumulate weight gradients"}),
       {}},
      // bf16 wire: dy rounded to bf16 by its owner and the gathered rows
      // widened ("convert"); the reduce-scatters' partial sums converted at
      // every step, on their own clocks.
      {"ring bf16 wire",
       {"ranks=4", "dispatch=ring", "wire_dtype=bf16"},
       with({"gather rows", "token encode", "unpack rows", "convert"}),
       {"reduce_scatter to bf16", "reduce_scatter from bf16"}}};
  for (const Case& c : cases) {
    const std::filesystem::path trace_path = dir("trace_" + std::to_string(&c - cases.data()) + ".json");
    std::vector<std::string> keys = {"clock=modelled", "trace_file=" + trace_path.string()};
    keys.insert(keys.end(), c.keys.begin(), c.keys.end());
    ASSERT_FALSE(layer_metrics(in, keys).is_null()) << c.what;
    std::set<std::string> names, on_lanes;
    for (const nlohmann::json& e : check_trace_structure(trace_path, 1e-6, c.what)) {
      if (e.value("cat", "") == "compute") names.insert(e.at("name").get<std::string>());
      if (e.value("cat", "") == "collective") on_lanes.insert(e.at("name").get<std::string>());
    }
    for (const std::string& name : c.expected) EXPECT_TRUE(names.count(name)) << c.what << ": no '" << name << "'";
    for (const std::string& name : c.expected_on_lanes)
      EXPECT_TRUE(on_lanes.count(name)) << c.what << ": no '" << name << "' on the collective lanes";
  }
}

// A slow rank (rank 0 computes twice the expert rows) on full-mesh links
// whose transfers take picoseconds: every wait of the others is for rank
// 0's compute, directly (its messages) or through ranks that forward them
// (the ring's all-gather and reduce-scatter steps), so it is idle, equal to
// the compute difference: C_0 - C_r within 1 ns (the transfers: ~0.01 ns
// per message, a few dozen messages a rank). Rank 0 is the critical path.
TEST_F(ModelledDeterminism, WaitsForASlowRankAreIdleOnEveryOtherRank) {
  const std::filesystem::path in = dir("in");
  generate(in, {.tokens = 400, .hidden = 16, .ffn = 256, .experts = 8});
  // As ARankWithTwiceTheRowsIsTheCriticalPath (modelled_layer_test.cc): rank
  // 0 receives 8 of every 10 tokens' rows, ranks 1-3 4 each.
  craft_routing(in, [](std::int64_t t) -> std::pair<int, int> {
    const int slot = static_cast<int>(t % 10), alt = static_cast<int>((t / 10) % 2);
    if (slot < 4) return {0 + alt, 2 + alt};
    if (slot < 8) return {0 + alt, 4 + alt};
    return {6, 7};
  });
  for (const std::string dispatch : {"ring", "alltoall"}) {
    const nlohmann::json m =
        layer_metrics(in, {"ranks=4", "clock=modelled", "dispatch=" + dispatch, "link_topology=full_mesh",
                           "link_bandwidth_gbps=1e6", "link_latency_us=0"});
    ASSERT_FALSE(m.is_null()) << dispatch;
    const double compute0 = rank_modelled(m, 0, "compute_seconds");
    EXPECT_EQ(m.at("modelled").at("critical_path_rank").get<int>(), 0) << dispatch;
    for (int r = 1; r < 4; ++r) {
      const double compute = rank_modelled(m, r, "compute_seconds");
      ASSERT_GT(compute0 - compute, 1e-7) << dispatch << " rank " << r << ": rank 0 must be slower";
      EXPECT_NEAR(rank_modelled(m, r, "idle_seconds"), compute0 - compute, 1e-9)
          << dispatch << " rank " << r << ": communication " << rank_modelled(m, r, "communication_seconds");
    }
  }
}

}  // namespace
}  // namespace epmoe::testing
