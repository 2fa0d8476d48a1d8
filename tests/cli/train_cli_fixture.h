// Shared by the end-to-end tests of `epmoe train` (threads and mpirun): a
// tiny model that trains 20 steps in well under a second, and the metrics
// file read back as one JSON object per step.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "epmoe_cli_fixture.h"

namespace epmoe::testing {

// V=64 H=32 F=32 E=8 K=2 L=2, 8 sequences of 16 tokens per step, one
// compute thread per rank (ranks of concurrent tests share two cores).
inline std::vector<std::string> tiny_train_keys(const std::filesystem::path& metrics_file) {
  return {"vocab_size=64",
          "hidden=32",
          "ffn=32",
          "num_experts=8",
          "num_layers=2",
          "batch_size=8",
          "seq_len=16",
          "steps=20",
          "warmup_steps=5",
          "progress=off",
          "metrics_file=" + metrics_file.string()};
}

inline std::vector<nlohmann::json> read_metrics_lines(const std::filesystem::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

inline std::vector<double> losses_of(const std::vector<nlohmann::json>& lines) {
  std::vector<double> losses;
  for (const nlohmann::json& line : lines) losses.push_back(line.at("loss").get<double>());
  return losses;
}

inline double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

}  // namespace epmoe::testing
