// Per-step expert loads from a training run's metrics file (`epmoe train`'s
// metrics.jsonl, one JSON object per step, model/step_metrics.h StepRecord): the
// field "expert_counts" [L][E] holds each MoE layer's global (token, k) pairs
// per expert. `epmoe balance --loads run/metrics.jsonl` replays them.
//
// Rules (a FileError naming the file, the line and the rule otherwise):
//  * every non-blank line is a JSON object with an integer "step" >= 1 and
//    "expert_counts", an array of L >= 1 arrays of E >= 1 integers >= 0;
//    L and E are those of the first line on every line;
//  * at least one such line (an empty file is refused);
//  * rows are ordered by step (the file's order for a file epmoe train wrote:
//    its steps increase line by line). A step on several lines — two runs'
//    files concatenated, or a resumed run's file that was not cut back —
//    takes its last line: the later run is the one that went on (a resumed
//    run repeats its steps bit for bit, so with one run's lines this changes
//    nothing). Missing steps (a file that lost lines) are not filled in: the
//    replay's steps are the lines there are;
//  * the counts of a layer sum to at most 2^63-1 over the file (the replay adds
//    them up in int64).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "balance/expert_load_history.h"

namespace epmoe::cli {

struct MetricsLoads {
  int num_layers = 0;                               // L of the file
  int num_experts = 0;                              // E
  std::vector<int> layers;                          // the layers read, ascending
  std::vector<balance::ExpertLoadHistory> history;  // one per entry of `layers`: [steps, E]
  std::vector<std::int64_t> train_steps;            // the "step" of each row
  int superseded_lines = 0;                         // lines replaced by a later line of their step
};

// Whether `file` is read as metrics JSON lines rather than .npy: its name ends
// in ".jsonl", or it is a regular file whose first non-blank byte is '{'.
// Anything else (a missing file, a FIFO, an .npy) goes to the .npy reader and
// its errors.
bool is_metrics_file(const std::filesystem::path& file);

// `layer`: one layer (0-based), or every layer. A layer >= L is a ConfigError
// naming layer= and the file's L.
MetricsLoads read_metrics_loads(const std::filesystem::path& file, std::optional<int> layer);

}  // namespace epmoe::cli
