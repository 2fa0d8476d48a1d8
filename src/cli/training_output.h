// What `epmoe train` shows and records while it runs (rank 0 only):
//  * MetricsFile: JSON lines, one object per step (model/step_metrics.h
//    StepRecord), flushed as each step ends so a killed run keeps every
//    finished step, and fsynced before a checkpoint of that step is
//    committed, so a checkpoint never outlives its step's line. A resumed run first drops the lines after the step it
//    resumed from (the interrupted run's steps that are being redone), so the
//    file reads as one run.
//  * ProgressLine: on a terminal one line rewritten in place (step, loss,
//    tokens/s, max/mean expert load, ETA); elsewhere the same line every
//    log_every steps, so CI logs stay short.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "core/timer.h"
#include "model/trainer.h"

namespace epmoe::cli {

class MetricsFile {
 public:
  // Creates the parent directory and checks the file can be written:
  // FileError naming the path otherwise. Touches nothing else.
  static void check_writable(const std::filesystem::path& path);

  // Starts the file: truncated for a fresh run, cut back to the lines with
  // step <= resumed_from for a resumed one.
  MetricsFile(std::filesystem::path path, std::optional<std::int64_t> resumed_from);
  void append(const StepRecord& record);
  const std::filesystem::path& path() const { return path_; }
  // Resumed from step N: the steps <= N the file had no line for, as ranges
  // ("1-10, 14"); empty when it had them all. They cannot be recomputed, so
  // the caller says so instead of leaving a silent hole in the curve.
  const std::string& missing_steps() const { return missing_steps_; }

 private:
  std::filesystem::path path_;
  std::string missing_steps_;
  std::ofstream out_;
};

enum class ProgressMode { auto_detect, on, off };

class ProgressLine {
 public:
  ProgressLine(ProgressMode mode, std::int64_t total_steps, std::int64_t log_every);
  ~ProgressLine();  // ends an in-place line
  void start(std::int64_t first_step);
  void update(const StepRecord& record);

 private:
  bool in_place_ = false, enabled_ = true;
  std::int64_t total_steps_, log_every_, first_step_ = 0;
  Stopwatch watch_;
  double last_draw_ = -1;
  bool drew_ = false;
};

}  // namespace epmoe::cli
