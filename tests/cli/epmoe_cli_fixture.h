// Shared by the end-to-end tests of the `epmoe` executable: running it (or
// mpirun) as a subprocess in a fresh scratch directory per test, generating
// inputs with `epmoe gen-inputs`, the bad-input contract, and comparing the
// .npy outputs of two runs. The binary's path comes from the EPMOE_BINARY
// compile definition of the test target.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/npy.h"
#include "data/test_files.h"

namespace epmoe::testing {

struct ProcessResult {
  int exit_code = -1;
  std::string stdout_text;
  std::string stderr_text;
};

// Runs argv[0] with its arguments, capturing stdout and stderr through files
// in `scratch` (no shell, so no quoting issues). With a `deadline` the child
// is SIGKILLed once it passes (exit code 137), so a run that hangs shows as
// a failed result instead of a hung test.
inline ProcessResult run_program(const ScratchDir& scratch, std::vector<std::string> argv_strings,
                                 std::optional<std::chrono::milliseconds> deadline = std::nullopt) {
  const auto stdout_path = scratch / "stdout.txt", stderr_path = scratch / "stderr.txt";
  std::vector<char*> argv;
  for (std::string& argument : argv_strings) argv.push_back(argument.data());
  argv.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  if (!deadline) {
    ::waitpid(pid, &status, 0);
  } else {
    const auto end = std::chrono::steady_clock::now() + *deadline;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > end) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ProcessResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.stdout_text = read_bytes(stdout_path);
  result.stderr_text = read_bytes(stderr_path);
  std::filesystem::remove(stdout_path);
  std::filesystem::remove(stderr_path);
  return result;
}

inline ProcessResult run_epmoe(const ScratchDir& scratch, const std::vector<std::string>& arguments) {
  std::vector<std::string> argv = {EPMOE_BINARY};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  return run_program(scratch, argv);
}

inline std::set<std::string> entries(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

inline nlohmann::json read_metrics(const std::filesystem::path& out_dir) {
  return nlohmann::json::parse(read_bytes(out_dir / "metrics.json"));
}

// max|a - b| / max|b| over two arrays of one shape (f32 or i32); +inf when the
// shapes differ, so a shape mismatch fails any tolerance.
inline double max_relative_difference(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return INFINITY;
  double max_difference = 0, max_reference = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.dtype() == DType::i32 ? a.data<std::int32_t>()[i] : a.data<float>()[i];
    const double y = b.dtype() == DType::i32 ? b.data<std::int32_t>()[i] : b.data<float>()[i];
    max_difference = std::max(max_difference, std::abs(x - y));
    max_reference = std::max(max_reference, std::abs(y));
  }
  return max_reference > 0 ? max_difference / max_reference : max_difference;
}

inline Tensor read_output(const std::filesystem::path& out_dir, const std::string& name) {
  return read_npy(out_dir / (name + ".npy"), name == "topk_ids" ? DType::i32 : DType::f32);
}

// Every output of `epmoe layer` with dy.npy given.
inline const std::vector<std::string>& layer_output_names() {
  static const std::vector<std::string> names = {"y", "topk_ids", "topk_weights", "dx", "dgate", "dwi0", "dwi1", "dwo"};
  return names;
}

// Every output in `out_dir` equals the one in `reference_dir` within
// `tolerance` relative (topk_ids exactly: routing is per token and runs
// before any communication).
inline void expect_outputs_match(const std::filesystem::path& out_dir, const std::filesystem::path& reference_dir,
                                 double tolerance) {
  for (const std::string& name : layer_output_names()) {
    const Tensor out = read_output(out_dir, name), reference = read_output(reference_dir, name);
    const double difference = max_relative_difference(out, reference);
    if (name == "topk_ids") {
      EXPECT_EQ(difference, 0.0) << name;
    } else {
      EXPECT_LE(difference, tolerance) << name << " of " << out_dir.filename();
    }
  }
}

// Test dimensions of the single-rank CLI tests (epmoe_cli_test.cc).
constexpr std::int64_t kTokens = 16, kHidden = 8, kFfn = 12, kExperts = 4, kTopK = 2;

class EpmoeCli : public ::testing::Test {
 protected:
  std::filesystem::path in_dir() const { return scratch_ / "in"; }
  std::filesystem::path out_dir() const { return scratch_ / "out"; }

  // gen-inputs with the dimensions above; `extra_keys` come later and win.
  void generate_inputs(std::vector<std::string> extra_keys = {}) {
    std::vector<std::string> arguments = {"gen-inputs",
                                          "--out",
                                          in_dir().string(),
                                          "num_tokens=" + std::to_string(kTokens),
                                          "hidden=" + std::to_string(kHidden),
                                          "ffn=" + std::to_string(kFfn),
                                          "num_experts=" + std::to_string(kExperts)};
    arguments.insert(arguments.end(), extra_keys.begin(), extra_keys.end());
    const ProcessResult result = run_epmoe(scratch_, arguments);
    ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  }

  // `epmoe layer` on in_dir() into `out` with threads=1 (one core per run,
  // so concurrent test processes do not oversubscribe the machine).
  ProcessResult run_layer_into(const std::filesystem::path& out, std::vector<std::string> keys = {}) {
    std::vector<std::string> arguments = {"layer", "--in", in_dir().string(), "--out", out.string(), "threads=1"};
    arguments.insert(arguments.end(), keys.begin(), keys.end());
    return run_epmoe(scratch_, arguments);
  }
  ProcessResult run_layer(std::vector<std::string> keys = {}) { return run_layer_into(out_dir(), std::move(keys)); }

  // The contract of every bad-input case: exit code 2, exactly one stderr
  // line "epmoe: error: ..." with every fragment, and no output at all (no
  // --out directory, no staging directory left beside it).
  // `program`: the binary's name, which starts the error line.
  void expect_rejected(const ProcessResult& result, std::initializer_list<std::string> fragments,
                       const std::string& program = "epmoe") {
    EXPECT_EQ(result.exit_code, 2) << result.stderr_text;
    EXPECT_EQ(result.stderr_text.rfind(program + ": error: ", 0), 0u) << result.stderr_text;
    ASSERT_FALSE(result.stderr_text.empty());
    EXPECT_EQ(result.stderr_text.find('\n'), result.stderr_text.size() - 1) << "not one line: " << result.stderr_text;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(result.stderr_text.find(fragment), std::string::npos)
          << "stderr: " << result.stderr_text << "missing: " << fragment;
    }
    EXPECT_FALSE(std::filesystem::exists(out_dir())) << "output directory created on error";
    std::set<std::string> expected = {"in"};
    if (!std::filesystem::exists(in_dir())) expected.clear();
    EXPECT_EQ(entries(scratch_.path()), expected) << "stray files beside the output directory";
  }

  ScratchDir scratch_;
};

}  // namespace epmoe::testing
