#include "cli/training_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_error.h"
#include "data/atomic_file.h"

namespace epmoe::cli {
namespace {

std::string format_duration(double seconds) {
  const auto total = static_cast<long long>(seconds + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60, total % 60);
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld", total / 60, total % 60);
  }
  return text;
}

}  // namespace

void MetricsFile::check_writable(const std::filesystem::path& path) {
  std::error_code error;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), error);
  if (error) {
    throw FileError("metrics_file=" + path.string() + ": cannot create its directory: " + error.message());
  }
  if (std::filesystem::is_directory(path)) {
    throw FileError("metrics_file=" + path.string() + ": is a directory; name a file");
  }
  // Opening for append creates the file if needed and changes no byte of an existing one.
  std::ofstream probe(path, std::ios::app);
  if (!probe) throw FileError("metrics_file=" + path.string() + ": cannot be written: " + errno_text());
}

MetricsFile::MetricsFile(std::filesystem::path path, std::optional<std::int64_t> resumed_from)
    : path_(std::move(path)) {
  check_writable(path_);
  std::string kept;
  if (resumed_from) {
    std::ifstream in(path_);
    std::string line;
    std::vector<bool> present(static_cast<std::size_t>(*resumed_from + 1), false);
    while (std::getline(in, line)) {
      const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      // A torn last line (the run was killed mid-write) or a step being redone is dropped.
      if (record.is_object() && record.value("step", std::int64_t{-1}) >= 0 &&
          record.value("step", std::int64_t{-1}) <= *resumed_from) {
        kept += line + "\n";
        present[static_cast<std::size_t>(record.value("step", std::int64_t{0}))] = true;
      }
    }
    for (std::int64_t step = 1; step <= *resumed_from; ++step) {
      if (present[static_cast<std::size_t>(step)]) continue;
      std::int64_t last = step;
      while (last < *resumed_from && !present[static_cast<std::size_t>(last + 1)]) ++last;
      // Built by append: GCC 12 warns falsely (-Wrestrict, PR105651) on "-" + string.
      if (!missing_steps_.empty()) missing_steps_ += ", ";
      missing_steps_ += std::to_string(step);
      if (last > step) {
        missing_steps_ += '-';
        missing_steps_ += std::to_string(last);
      }
      step = last;
    }
  }
  write_file_atomically(path_, {kept});
  out_.open(path_, std::ios::app);
  if (!out_) throw FileError("metrics_file=" + path_.string() + ": cannot be opened: " + errno_text());
}

void MetricsFile::append(const StepRecord& record) {
  out_ << nlohmann::json(record).dump() << '\n';
  out_.flush();
  if (!out_)
    throw FileError(path_.string() + ": writing the metrics of step " + std::to_string(record.step) +
                    " failed: " + errno_text());
  // A checkpoint of this step is committed next: the line must be on disk
  // first, or a crash could leave checkpoint N with no line N (a resume
  // keeps lines <= N and cannot recompute a lost one). fsync through a
  // second descriptor flushes the file's pages as well (one inode).
  if (record.checkpoint_step) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || (::fsync(fd) != 0 && errno != EINVAL)) {
      const std::string reason = errno_text();
      if (fd >= 0) ::close(fd);
      throw FileError(path_.string() + ": flushing the metrics of step " + std::to_string(record.step) +
                      " to disk failed: " + reason);
    }
    ::close(fd);
  }
}

ProgressLine::ProgressLine(ProgressMode mode, std::int64_t total_steps, std::int64_t log_every)
    : total_steps_(total_steps), log_every_(log_every) {
  const bool terminal = isatty(fileno(stderr)) != 0;
  enabled_ = mode != ProgressMode::off;
  in_place_ = terminal && mode != ProgressMode::off;
}

ProgressLine::~ProgressLine() {
  if (in_place_ && drew_) std::fputc('\n', stderr);
}

void ProgressLine::start(std::int64_t first_step) {
  first_step_ = first_step;
  watch_ = Stopwatch();
}

void ProgressLine::update(const StepRecord& record) {
  if (!enabled_) return;
  const bool last = record.step == total_steps_;
  const double elapsed = watch_.elapsed_seconds();
  if (in_place_) {
    if (!last && elapsed - last_draw_ < 0.1) return;  // at most 10 redraws a second
  } else if (!last && record.step % log_every_ != 0) {
    return;
  }
  last_draw_ = elapsed;
  const double done = static_cast<double>(record.step - first_step_);
  const double eta = done > 0 ? elapsed / done * static_cast<double>(total_steps_ - record.step) : 0;
  double load = 1.0;
  for (const double l : record.expert_load_max_over_mean) load = std::max(load, l);
  // A modelled run's tokens_per_second is the modelled rate (no wall time
  // in its records): said so, not printed twice.
  const char* const modelled = record.modelled.is_null() ? "" : " (modelled)";
  char line[384];
  // Dropped pairs always show (0 included): a capacity limit never loses
  // tokens out of sight.
  std::snprintf(line, sizeof line,
                "step %lld/%lld  loss %.4f  grad %.3f  lr %.2e  %.1fk tok/s%s  expert load max/mean %.2f  "
                "dropped %lld/%lld  ETA %s",
                static_cast<long long>(record.step), static_cast<long long>(total_steps_), record.loss,
                record.grad_norm, record.learning_rate, record.tokens_per_second / 1e3, modelled, load,
                static_cast<long long>(record.dropped_pairs), static_cast<long long>(record.routed_pairs),
                format_duration(eta).c_str());
  if (in_place_) {
    std::fprintf(stderr, "\r%s\033[K", line);
    std::fflush(stderr);
    drew_ = true;
  } else {
    std::fprintf(stdout, "%s\n", line);
    std::fflush(stdout);
  }
}

}  // namespace epmoe::cli
