// `epmoe train` end to end on the threads transport: the run's outputs
// (metrics lines, progress, summary, dropped pairs), YAML + key=value config,
// bad input refused before any work, resume through the command line (also
// on another rank count), a run killed while writing checkpoints leaving the
// previous one loadable, one killed right after a commit keeping that step's
// metrics line, the checkpoint directory's lock, a manifest-less step_N/ and
// leftovers of killed runs.
// Topology: ranks as threads (transport=threads), R in {1, 2, 3, 4}, threads=1
// (one compute thread per rank).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>

#include "data/checkpoint_store.h"
#include "train_cli_fixture.h"

namespace epmoe::testing {
namespace {

namespace fs = std::filesystem;

class TrainCli : public EpmoeCli {
 protected:
  fs::path metrics() const { return scratch_ / "run" / "metrics.jsonl"; }
  fs::path checkpoints() const { return scratch_ / "run" / "checkpoints"; }

  // `epmoe train` with the tiny model's keys (except those named in
  // `unset`), then `keys`.
  ProcessResult train(std::vector<std::string> keys, const std::string& unset = "") {
    std::vector<std::string> arguments = {"train", "threads=1"};
    for (const std::string& key : tiny_train_keys(metrics())) {
      if (unset.empty() || key.rfind(unset + "=", 0) != 0) arguments.push_back(key);
    }
    arguments.insert(arguments.end(), keys.begin(), keys.end());
    return run_epmoe(scratch_, arguments);
  }
};

TEST_F(TrainCli, WritesOneMetricsLinePerStepAndShowsTheLossFalling) {
  const ProcessResult result = train({"ranks=4", "progress=on", "log_every=5"});
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  const std::vector<nlohmann::json> lines = read_metrics_lines(metrics());
  ASSERT_EQ(lines.size(), 20u);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json& line = lines[i];
    EXPECT_EQ(line.at("step").get<std::int64_t>(), static_cast<std::int64_t>(i + 1));
    EXPECT_GT(line.at("grad_norm").get<double>(), 0.0);
    EXPECT_GT(line.at("tokens_per_second").get<double>(), 0.0);
    EXPECT_GT(line.at("phase_seconds").at("moe/experts").get<double>(), 0.0);
    EXPECT_GT(line.at("bytes_sent").at("moe/forward/all_to_all_v tokens").get<std::int64_t>(), 0);
    EXPECT_GT(line.at("bytes_sent").at("gradients/all_reduce").get<std::int64_t>(), 0);
    EXPECT_EQ(line.at("expert_load_max_over_mean").size(), 2u);
    EXPECT_EQ(line.at("rank_load_max_over_mean_before").size(), 2u);
    EXPECT_GT(line.at("saved_activation_peak_bytes").get<std::int64_t>(), 0);
    EXPECT_EQ(line.at("dropped_pairs").get<std::int64_t>(), 0);              // capacity_factor=0: exact buffers
    EXPECT_EQ(line.at("routed_pairs").get<std::int64_t>(), 8 * 16 * 2 * 2);  // tokens x K x L
  }
  EXPECT_LT(lines.back()["loss"].get<double>(), lines.front()["loss"].get<double>() - 0.3);
  // Off a terminal: a progress line every log_every steps, then the summary.
  EXPECT_NE(result.stdout_text.find("step 5/20  loss"), std::string::npos) << result.stdout_text;
  EXPECT_NE(result.stdout_text.find("step 20/20"), std::string::npos);
  EXPECT_NE(result.stdout_text.find("ETA"), std::string::npos);
  EXPECT_NE(result.stdout_text.find("epmoe train: 20 steps on 4 rank(s)"), std::string::npos);
  EXPECT_NE(result.stdout_text.find("dropped 0/512  ETA"), std::string::npos) << result.stdout_text;
  EXPECT_NE(result.stdout_text.find("; dropped 0 of 10240 (token, expert) pairs"), std::string::npos)
      << result.stdout_text;
}

// The N in "dropped N/M" of every progress line, and in the summary's
// "dropped N of M".
std::vector<long long> numbers_after(const std::string& text, const std::string& marker) {
  std::vector<long long> numbers;
  for (std::size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1)) {
    numbers.push_back(std::stoll(text.substr(at + marker.size())));
  }
  return numbers;
}

TEST_F(TrainCli, DroppedPairsShowInTheMetricsTheProgressLineAndTheSummary) {
  // capacity_factor=0.5: each expert takes at most half its mean share from
  // each source rank, so every step drops pairs.
  const ProcessResult result = train({"ranks=2", "capacity_factor=0.5", "progress=on", "log_every=5"});
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  const std::vector<nlohmann::json> lines = read_metrics_lines(metrics());
  ASSERT_EQ(lines.size(), 20u);
  long long total = 0;
  for (const nlohmann::json& line : lines) {
    const long long dropped = line.at("dropped_pairs").get<long long>();
    EXPECT_GT(dropped, 0) << line.dump();
    EXPECT_LT(dropped, line.at("routed_pairs").get<long long>());
    total += dropped;
  }
  const std::vector<long long> shown = numbers_after(result.stdout_text, "  dropped ");
  ASSERT_EQ(shown.size(), 4u) << result.stdout_text;  // steps 5, 10, 15, 20
  for (std::size_t i = 0; i < shown.size(); ++i)
    EXPECT_EQ(shown[i], lines[5 * i + 4]["dropped_pairs"].get<long long>());
  const std::vector<long long> summary = numbers_after(result.stdout_text, "; dropped ");
  ASSERT_EQ(summary.size(), 1u) << result.stdout_text;
  EXPECT_EQ(summary[0], total);
  EXPECT_NE(result.stdout_text.find("capacity_factor=0.5)"), std::string::npos) << result.stdout_text;
}

// On a terminal (a pseudo-terminal from util-linux `script`, part of every
// Debian system) the progress line is redrawn in place on stderr.
TEST_F(TrainCli, OnATerminalTheProgressLineIsRedrawnInPlace) {
  std::string command = std::string(EPMOE_BINARY) + " train threads=1 ranks=2 progress=auto";
  for (const std::string& key : tiny_train_keys(metrics())) {
    if (key != "progress=off") command += " " + key;
  }
  const ProcessResult result = run_program(scratch_, {"/usr/bin/script", "-qec", command, "/dev/null"});
  ASSERT_EQ(result.exit_code, 0) << result.stdout_text << result.stderr_text;
  // The terminal's output (stdout and stderr merged) arrives on script's stdout.
  EXPECT_NE(result.stdout_text.find("\rstep "), std::string::npos) << result.stdout_text;
  EXPECT_NE(result.stdout_text.find("\033[K"), std::string::npos);
  EXPECT_NE(result.stdout_text.find("step 20/20"), std::string::npos);
  EXPECT_NE(result.stdout_text.find("epmoe train: 20 steps"), std::string::npos);
}

TEST_F(TrainCli, YamlConfigWithCommandLineOverrides) {
  write_bytes(scratch_ / "train.yaml", "steps: 7\nnum_layers: 1\nremat_policy: full\n");
  const ProcessResult result =
      train({"--config", (scratch_ / "train.yaml").string(), "steps=4", "ranks=2"}, /*unset=*/"num_layers");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  const std::vector<nlohmann::json> lines = read_metrics_lines(metrics());
  ASSERT_EQ(lines.size(), 4u);                                  // the command line wins over the file
  EXPECT_EQ(lines[0]["expert_load_max_over_mean"].size(), 1u);  // num_layers from the file
}

TEST_F(TrainCli, BadInputIsOneLineBeforeAnyWork) {
  const auto expect_refused = [&](const ProcessResult& result, const std::string& fragment) {
    EXPECT_EQ(result.exit_code, 2) << result.stderr_text;
    EXPECT_EQ(result.stderr_text.rfind("epmoe: error: ", 0), 0u) << result.stderr_text;
    EXPECT_EQ(result.stderr_text.find('\n'), result.stderr_text.size() - 1) << result.stderr_text;
    EXPECT_NE(result.stderr_text.find(fragment), std::string::npos) << result.stderr_text;
    EXPECT_FALSE(fs::exists(scratch_ / "run")) << "work started: " << result.stderr_text;
  };
  expect_refused(train({"ranks=4", "num_expert=8"}), "unknown key 'num_expert'; did you mean 'num_experts'");
  expect_refused(train({"ranks=4", "steps=ten"}), "steps=ten");
  expect_refused(train({"ranks=4", "--config", (scratch_ / "missing.yaml").string()}), "missing.yaml");
  expect_refused(train({"ranks=3", "batch_size=9"}), "must divide num_experts=8");
  expect_refused(train({"ranks=4", "batch_size=6"}), "batch_size=6: must be divisible by ranks=4");
  expect_refused(train({"ranks=4", "resume=true"}), "resume=true: needs checkpoint_dir");
  expect_refused(train({"ranks=4", "router=random", "aux_loss_coef=0.1"}), "aux_loss_coef");
  write_bytes(scratch_ / "a_file", "not a directory");
  expect_refused(train({"ranks=4", "checkpoint_dir=" + (scratch_ / "a_file" / "ckpt").string()}), "checkpoint_dir=");
}

TEST_F(TrainCli, ADivergedRunStopsWithAClearErrorAndKeepsItsMetrics) {
  const ProcessResult result = train({"ranks=2", "learning_rate=1e30", "grad_clip=0"});
  EXPECT_EQ(result.exit_code, 2);
  // Caught by the trainer (non-finite loss or gradient norm) or, first, by a
  // layer's own finite check; either way the message names the step.
  EXPECT_EQ(result.stderr_text.rfind("epmoe: error: step ", 0), 0u) << result.stderr_text;
  EXPECT_TRUE(result.stderr_text.find("training diverged") != std::string::npos ||
              result.stderr_text.find("non-finite") != std::string::npos)
      << result.stderr_text;
  const std::vector<nlohmann::json> lines = read_metrics_lines(metrics());
  ASSERT_FALSE(lines.empty());  // the finite steps before it are kept
  EXPECT_TRUE(std::isfinite(lines.back()["loss"].get<double>()));
}

TEST_F(TrainCli, ResumeFromTheCommandLineContinuesTheCurveBitForBit) {
  const fs::path reference_metrics = scratch_ / "reference.jsonl";
  std::vector<std::string> keys = {"ranks=2", "checkpoint_every=10", "checkpoint_dir=" + checkpoints().string()};
  ASSERT_EQ(train(keys).exit_code, 0);
  fs::rename(metrics(), reference_metrics);
  const std::vector<double> uninterrupted = losses_of(read_metrics_lines(reference_metrics));
  // Stop after step 10: drop step 20 and the metrics after step 10 (plus a
  // torn line, as a kill mid-write leaves it).
  fs::remove_all(CheckpointStore(checkpoints()).step_dir(20));
  std::string kept;
  for (const nlohmann::json& line : read_metrics_lines(reference_metrics)) {
    if (line["step"].get<int>() <= 12) kept += line.dump() + "\n";
  }
  write_bytes(metrics(), kept + "{\"step\": 13, \"lo");

  const ProcessResult again = train(keys);
  EXPECT_EQ(again.exit_code, 2);  // checkpoints exist and resume=false: never overwritten
  EXPECT_NE(again.stderr_text.find("resume=true"), std::string::npos) << again.stderr_text;
  keys.push_back("resume=true");
  const ProcessResult resumed = train(keys);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
  EXPECT_NE(resumed.stdout_text.find("resuming from step 10"), std::string::npos) << resumed.stdout_text;
  EXPECT_EQ(losses_of(read_metrics_lines(metrics())), uninterrupted);  // steps 1..10 kept, 11..20 redone
  const ProcessResult finished = train(keys);
  ASSERT_EQ(finished.exit_code, 0);
  EXPECT_NE(finished.stdout_text.find("nothing to do"), std::string::npos);
}

// SIGKILL at several moments of a run that checkpoints every step (after its
// first checkpoint, so slow sanitizer builds test the same thing): whenever
// it dies, the newest committed checkpoint verifies and a resumed run starts
// from it.
TEST_F(TrainCli, KillingARunDuringCheckpointWritesLeavesTheLastOneLoadable) {
  int killed_while_staging = 0;
  for (const int delay_ms : {0, 30, 70, 110, 160, 230}) {
    SCOPED_TRACE("killed " + std::to_string(delay_ms) + " ms after the first checkpoint");
    fs::remove_all(scratch_ / "run");
    std::vector<std::string> argv = {EPMOE_BINARY,        "train",
                                     "threads=1",         "ranks=2",
                                     "steps=100000",      "checkpoint_every=1",
                                     "checkpoint_keep=2", "checkpoint_dir=" + checkpoints().string()};
    for (const std::string& key : tiny_train_keys(metrics())) {
      if (key.rfind("steps=", 0) != 0) argv.push_back(key);
    }
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, STDOUT_FILENO);
      ::dup2(null, STDERR_FILENO);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!CheckpointStore(checkpoints()).latest_step() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the run ended before it was killed";

    const CheckpointStore store(checkpoints());
    for (const auto& entry : fs::directory_iterator(checkpoints())) {
      if (entry.path().filename().string().rfind(".staging", 0) == 0) ++killed_while_staging;
    }
    const std::optional<std::int64_t> latest = store.latest_step();
    ASSERT_TRUE(latest.has_value()) << "no checkpoint committed in " << delay_ms << " ms";
    EXPECT_NO_THROW(store.verify(*latest));
    const ProcessResult resumed = train(
        {"ranks=2", "resume=true", "checkpoint_dir=" + checkpoints().string(), "steps=" + std::to_string(*latest + 1)});
    EXPECT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
    EXPECT_NE(resumed.stdout_text.find("resuming from step " + std::to_string(*latest)), std::string::npos);
  }
  // Not a requirement of the property, but it shows the kills landed inside writes.
  std::printf("killed during a checkpoint write in %d of 6 runs\n", killed_while_staging);
}

std::string read_bytes_or_empty(const fs::path& path) { return fs::exists(path) ? read_bytes(path) : ""; }

// Starts `epmoe train` with the tiny keys (steps= from `keys` wins) in the
// background, output to /dev/null.
pid_t spawn_train(const std::vector<std::string>& keys, const fs::path& metrics_file) {
  std::vector<std::string> argv = {EPMOE_BINARY, "train", "threads=1"};
  for (const std::string& key : tiny_train_keys(metrics_file)) argv.push_back(key);
  argv.insert(argv.end(), keys.begin(), keys.end());  // later keys override earlier ones
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

// Sets an environment variable for the runs started while it lives (the
// children inherit it).
struct ScopedEnvironment {
  ScopedEnvironment(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ~ScopedEnvironment() { ::unsetenv(name_); }
  const char* name_;
};

TEST_F(TrainCli, ASecondTrainerOnTheSameCheckpointDirIsRefusedNamingThePid) {
  const std::string dir = "checkpoint_dir=" + checkpoints().string();
  // Checkpoints only at its (never reached) end: the directory holds still
  // while the second trainer tries.
  const pid_t first = spawn_train({"ranks=2", "steps=100000", dir}, scratch_ / "first.jsonl");
  const fs::path lock = checkpoints() / ".epmoe_train.lock";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  // Until it holds the lock and has trained a step: by then its start-up
  // checks are done (the write probe it creates and removes right after
  // taking the lock was once caught here in between).
  while ((read_bytes_or_empty(lock) != std::to_string(first) + "\n" ||
          read_bytes_or_empty(scratch_ / "first.jsonl").empty()) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::set<std::string> before = entries(checkpoints());
  const ProcessResult second = train({"ranks=2", "resume=true", dir});
  ::kill(first, SIGKILL);
  ::waitpid(first, nullptr, 0);
  EXPECT_EQ(second.exit_code, 2) << second.stderr_text;
  EXPECT_NE(second.stderr_text.find("checkpoint_dir=" + checkpoints().string() + " is in use"), std::string::npos)
      << second.stderr_text;
  EXPECT_NE(second.stderr_text.find("pid " + std::to_string(first)), std::string::npos) << second.stderr_text;
  EXPECT_EQ(second.stderr_text.find('\n'), second.stderr_text.size() - 1) << second.stderr_text;
  EXPECT_FALSE(fs::exists(metrics())) << "the refused run wrote its metrics";
  EXPECT_EQ(entries(checkpoints()), before);
  // The lock dies with its holder: the next run gets it.
  const ProcessResult after = train({"ranks=2", "steps=2", "checkpoint_dir=" + (scratch_ / "other").string()});
  EXPECT_EQ(after.exit_code, 0) << after.stderr_text;
  const ProcessResult again = train({"ranks=2", "resume=true", "steps=1", dir});
  EXPECT_EQ(again.exit_code, 0) << again.stderr_text;
}

// Killed (fault point checkpoint_committed: SIGKILL right after rank 0
// committed step 5): the metrics line of step 5 is already on disk.
TEST_F(TrainCli, ARunKilledJustAfterACheckpointCommitKeepsThatStepsMetricsLine) {
  const std::vector<std::string> keys = {"ranks=2", "checkpoint_every=5", "checkpoint_dir=" + checkpoints().string()};
  ASSERT_EQ(train(keys).exit_code, 0);
  const std::vector<double> uninterrupted = losses_of(read_metrics_lines(metrics()));
  fs::remove_all(scratch_ / "run");
  {
    const ScopedEnvironment fault("EPMOE_FAULT_INJECTION", "0:checkpoint_committed:kill");
    const ProcessResult killed = train(keys);
    ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.stderr_text;
  }
  EXPECT_EQ(CheckpointStore(checkpoints()).latest_step(), 5);
  const std::vector<nlohmann::json> lines = read_metrics_lines(metrics());
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines.back()["step"], 5);
  EXPECT_EQ(lines.back()["checkpoint_step"], 5);
  std::vector<std::string> resume = keys;
  resume.push_back("resume=true");
  const ProcessResult resumed = train(resume);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
  EXPECT_EQ(resumed.stdout_text.find("has no lines"), std::string::npos) << resumed.stdout_text;
  EXPECT_EQ(losses_of(read_metrics_lines(metrics())), uninterrupted);  // one curve, no step missing
}

// Lines of steps before the resume point cannot be recomputed; a resume
// says which are missing instead of leaving a silent hole.
TEST_F(TrainCli, AResumeNamesTheMetricsLinesItCannotRecompute) {
  const std::vector<std::string> keys = {"ranks=2", "steps=10", "checkpoint_dir=" + checkpoints().string()};
  ASSERT_EQ(train(keys).exit_code, 0);
  std::string kept;
  for (const nlohmann::json& line : read_metrics_lines(metrics())) {
    if (line["step"] != 3 && line["step"] != 4) kept += line.dump() + "\n";
  }
  write_bytes(metrics(), kept);
  const ProcessResult resumed =
      train({"ranks=2", "steps=12", "resume=true", "checkpoint_dir=" + checkpoints().string()});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
  EXPECT_NE(resumed.stdout_text.find("note: metrics_file=" + metrics().string() + " has no lines for steps 3-4 "),
            std::string::npos)
      << resumed.stdout_text;
  EXPECT_EQ(read_metrics_lines(metrics()).size(), 10u);  // 8 kept + steps 11, 12
}

TEST_F(TrainCli, ACheckpointDirectoryWithoutManifestIsReportedAtStart) {
  const std::vector<std::string> keys = {"ranks=2", "checkpoint_every=10", "checkpoint_dir=" + checkpoints().string()};
  ASSERT_EQ(train(keys).exit_code, 0);
  const fs::path step20 = CheckpointStore(checkpoints()).step_dir(20);
  fs::remove(step20 / "manifest.json");
  std::vector<std::string> resume = keys;
  resume.push_back("resume=true");
  resume.push_back("steps=30");
  const auto metrics_before = read_bytes(metrics());
  const ProcessResult result = train(resume);
  EXPECT_EQ(result.exit_code, 2) << result.stdout_text;
  EXPECT_EQ(result.stderr_text.rfind("epmoe: error: " + step20.string() +
                                         ": a checkpoint directory without "
                                         "manifest.json",
                                     0),
            0u)
      << result.stderr_text;
  EXPECT_EQ(result.stdout_text.find("resuming"), std::string::npos) << result.stdout_text;  // no work done
  EXPECT_EQ(read_bytes(metrics()), metrics_before);
}

TEST_F(TrainCli, LeftoversOfKilledRunsAreRemovedAndReported) {
  const fs::path staging = checkpoints() / ".staging_step_00000007";
  const fs::path removing = checkpoints() / ".removing_step_00000003";
  fs::create_directories(staging / "rank_0");
  write_bytes(staging / "rank_0" / "layer_0.wi0.npy", "half written");
  fs::create_directories(removing);
  const ProcessResult result = train({"ranks=2", "steps=2", "checkpoint_dir=" + checkpoints().string()});
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_NE(result.stdout_text.find("removed " + staging.string() + " (left by a run killed"), std::string::npos)
      << result.stdout_text;
  EXPECT_NE(result.stdout_text.find("removed " + removing.string()), std::string::npos) << result.stdout_text;
  EXPECT_FALSE(fs::exists(staging));
  EXPECT_FALSE(fs::exists(removing));
  EXPECT_EQ(CheckpointStore(checkpoints()).committed_steps(), std::vector<std::int64_t>{2});
}

// A 4-rank checkpoint resumed on 2 ranks from the command line (the model
// tests cover the numbers of other rank counts), and on 3 ranks refused
// (3 does not divide num_experts=8).
TEST_F(TrainCli, ACheckpointResumesOnAnotherRankCountDividingTheExperts) {
  ASSERT_EQ(train({"ranks=2"}).exit_code, 0);
  const std::vector<double> two_ranks = losses_of(read_metrics_lines(metrics()));
  const std::string dir = "checkpoint_dir=" + checkpoints().string();
  ASSERT_EQ(train({"ranks=4", "checkpoint_every=10", dir}).exit_code, 0);
  fs::remove_all(CheckpointStore(checkpoints()).step_dir(20));
  const ProcessResult odd = train({"ranks=3", "batch_size=6", "resume=true", dir});
  EXPECT_EQ(odd.exit_code, 2);
  EXPECT_NE(odd.stderr_text.find("must divide num_experts=8"), std::string::npos) << odd.stderr_text;
  const ProcessResult resumed = train({"ranks=2", "resume=true", dir});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
  EXPECT_NE(resumed.stdout_text.find("note: resharding the experts of " +
                                     CheckpointStore(checkpoints()).step_dir(10).string() + " from 4 to 2 ranks"),
            std::string::npos)
      << resumed.stdout_text;
  EXPECT_LT(max_relative_difference(losses_of(read_metrics_lines(metrics())), two_ranks), 1e-5);
}

}  // namespace
}  // namespace epmoe::testing
