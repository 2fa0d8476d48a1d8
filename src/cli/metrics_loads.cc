#include "cli/metrics_loads.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_error.h"

namespace epmoe::cli {
namespace {

[[noreturn]] void fail_at(const std::filesystem::path& file, std::int64_t line, const std::string& what) {
  throw FileError(file.string() + ":" + std::to_string(line) + ": " + what);
}

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r\n") == std::string::npos; }

// nlohmann's "[json.exception.parse_error.101] parse error at line 1, column
// 7: ..." without the exception tag and the line (always 1: one JSON text
// per line).
std::string parse_error_text(const nlohmann::json::parse_error& error) {
  std::string text = error.what();
  if (const std::size_t tag_end = text.find("] ");
      text.rfind("[json.exception", 0) == 0 && tag_end != std::string::npos) {
    text.erase(0, tag_end + 2);
  }
  if (const std::size_t at = text.find("at line 1, "); at != std::string::npos) text.replace(at, 11, "at ");
  return text;
}

// One line's "expert_counts", checked: [L][E] integers >= 0.
std::vector<std::int64_t> counts_of_line(const std::filesystem::path& file, std::int64_t line_number,
                                         const nlohmann::json& counts, int& num_layers, int& num_experts) {
  const auto bad_shape = [&](const std::string& what) {
    fail_at(file, line_number, "\"expert_counts\" " + what + "; it must be [layers][experts] integers >= 0");
  };
  if (!counts.is_array() || counts.empty()) bad_shape(counts.is_array() ? "is empty" : "is not an array");
  if (num_layers == 0) {
    if (counts.size() > static_cast<std::size_t>(std::numeric_limits<int>::max())) bad_shape("has too many layers");
    num_layers = static_cast<int>(counts.size());
  } else if (counts.size() != static_cast<std::size_t>(num_layers)) {
    fail_at(file, line_number,
            "\"expert_counts\" has " + std::to_string(counts.size()) + " layers, the first line " +
                std::to_string(num_layers) + " (every line of one run records the same layers)");
  }
  std::vector<std::int64_t> flat;
  for (int l = 0; l < num_layers; ++l) {
    const nlohmann::json& layer = counts[static_cast<std::size_t>(l)];
    if (!layer.is_array() || layer.empty()) {
      bad_shape("[" + std::to_string(l) + "] " + (layer.is_array() ? "is empty" : "is not an array"));
    }
    if (num_experts == 0) {
      if (layer.size() > static_cast<std::size_t>(std::numeric_limits<int>::max())) bad_shape("has too many experts");
      num_experts = static_cast<int>(layer.size());
      flat.reserve(static_cast<std::size_t>(num_layers) * num_experts);
    } else if (layer.size() != static_cast<std::size_t>(num_experts)) {
      fail_at(file, line_number,
              "\"expert_counts\"[" + std::to_string(l) + "] has " + std::to_string(layer.size()) +
                  " experts, the first line " + std::to_string(num_experts) +
                  " (every layer of every line of one run has the same experts)");
    }
    for (int e = 0; e < num_experts; ++e) {
      const nlohmann::json& value = layer[static_cast<std::size_t>(e)];
      const std::string where = "\"expert_counts\"[" + std::to_string(l) + "][" + std::to_string(e) + "]";
      if (!value.is_number_integer()) fail_at(file, line_number, where + " = " + value.dump() + " is not an integer");
      if (value.is_number_unsigned() &&
          value.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        fail_at(file, line_number, where + " = " + value.dump() + " is larger than 2^63-1");
      }
      const std::int64_t count = value.get<std::int64_t>();
      if (count < 0) {
        fail_at(file, line_number, where + " = " + std::to_string(count) + "; expert counts are token counts >= 0");
      }
      flat.push_back(count);
    }
  }
  return flat;
}

// Only regular files: a FIFO would block the open forever, /dev/zero never ends.
void check_regular_file(const std::filesystem::path& file) {
  std::error_code error;
  const auto status = std::filesystem::status(file, error);
  if (!std::filesystem::exists(status)) throw_file_error(file, "no such file");
  if (std::filesystem::is_directory(status)) throw_file_error(file, "is a directory, not a metrics file");
  if (!std::filesystem::is_regular_file(status)) {
    throw_file_error(file, "not a regular file (a FIFO, socket or device); a metrics file must be a file");
  }
}

}  // namespace

bool is_metrics_file(const std::filesystem::path& file) {
  if (file.extension() == ".jsonl") return true;
  std::error_code error;
  if (!std::filesystem::is_regular_file(std::filesystem::status(file, error))) return false;
  // O_NONBLOCK: should a FIFO replace the file since the check, the open
  // returns at once and the read finds nothing.
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  char head[256];
  const ssize_t size = ::read(fd, head, sizeof head);
  ::close(fd);
  for (ssize_t i = 0; i < size; ++i) {
    if (head[i] == ' ' || head[i] == '\t' || head[i] == '\r' || head[i] == '\n') continue;
    return head[i] == '{';
  }
  return false;
}

MetricsLoads read_metrics_loads(const std::filesystem::path& file, std::optional<int> layer) {
  check_regular_file(file);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw_file_error(file, "cannot open: " + errno_text());

  MetricsLoads loads;
  std::map<std::int64_t, std::vector<std::int64_t>> rows;  // step -> the kept layers' counts, [layers * E]
  std::vector<std::int64_t> totals;                        // per layer, over every line: the overflow check
  std::string text;
  std::int64_t line_number = 0;
  while (std::getline(in, text)) {
    ++line_number;
    if (blank(text)) continue;
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& error) {
      fail_at(file, line_number,
              "not JSON (" + parse_error_text(error) +
                  "); every line of a metrics file is one JSON object "
                  "(a torn last line of a killed run: remove it)");
    }
    if (!record.is_object()) fail_at(file, line_number, "not a JSON object; every line of a metrics file is one");
    const auto step = record.find("step");
    if (step == record.end() || !step->is_number_integer() || step->get<std::int64_t>() < 1) {
      fail_at(file, line_number, "no integer \"step\" >= 1; not a line of epmoe train's metrics file");
    }
    const auto counts = record.find("expert_counts");
    if (counts == record.end()) {
      fail_at(file, line_number,
              "no \"expert_counts\" field: a metrics file of an older epmoe train, which did not record the "
              "expert counts; train again with this epmoe to replay its loads");
    }
    const bool first = loads.num_layers == 0;
    std::vector<std::int64_t> flat = counts_of_line(file, line_number, *counts, loads.num_layers, loads.num_experts);
    if (first) {
      if (layer && *layer >= loads.num_layers) {
        throw ConfigError("layer=" + std::to_string(*layer) + " is out of range: " + file.string() + ":" +
                          std::to_string(line_number) + " records " + std::to_string(loads.num_layers) +
                          " layers (layer=0.." + std::to_string(loads.num_layers - 1) + ", or all)");
      }
      if (layer) {
        loads.layers = {*layer};
      } else {
        for (int l = 0; l < loads.num_layers; ++l) loads.layers.push_back(l);
      }
      totals.assign(static_cast<std::size_t>(loads.num_layers), 0);
    }
    const std::size_t num_experts = static_cast<std::size_t>(loads.num_experts);
    for (int l = 0; l < loads.num_layers; ++l) {
      for (std::size_t e = 0; e < num_experts; ++e) {
        if (__builtin_add_overflow(totals[l], flat[l * num_experts + e], &totals[l])) {
          fail_at(file, line_number,
                  "the counts of layer " + std::to_string(l) +
                      " summed over the lines so far overflow a 64-bit "
                      "integer; expert counts are token counts (at most 2^63-1 in all)");
        }
      }
    }
    std::vector<std::int64_t> kept;
    kept.reserve(loads.layers.size() * num_experts);
    for (const int l : loads.layers) {
      kept.insert(kept.end(), flat.begin() + static_cast<std::ptrdiff_t>(l * num_experts),
                  flat.begin() + static_cast<std::ptrdiff_t>((l + 1) * num_experts));
    }
    if (!rows.insert_or_assign(step->get<std::int64_t>(), std::move(kept)).second) ++loads.superseded_lines;
  }
  if (in.bad()) throw_file_error(file, "read failed: " + errno_text());
  if (rows.empty()) {
    throw_file_error(file, line_number == 0
                               ? "empty (no lines); a metrics file has one JSON line per training step"
                               : "holds only blank lines; a metrics file has one JSON line per training step");
  }
  if (rows.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw_file_error(file, "more than 2^31-1 steps");

  const int num_steps = static_cast<int>(rows.size());
  const std::size_t num_experts = static_cast<std::size_t>(loads.num_experts);
  loads.history.resize(loads.layers.size());
  for (balance::ExpertLoadHistory& history : loads.history) {
    history.num_steps = num_steps;
    history.num_experts = loads.num_experts;
    history.counts.reserve(static_cast<std::size_t>(num_steps) * num_experts);
  }
  for (const auto& [step, kept] : rows) {
    loads.train_steps.push_back(step);
    for (std::size_t i = 0; i < loads.layers.size(); ++i) {
      loads.history[i].counts.insert(loads.history[i].counts.end(),
                                     kept.begin() + static_cast<std::ptrdiff_t>(i * num_experts),
                                     kept.begin() + static_cast<std::ptrdiff_t>((i + 1) * num_experts));
    }
  }
  return loads;
}

}  // namespace epmoe::cli
