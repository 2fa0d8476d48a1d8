#include "run/yaml_overrides.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <system_error>

#include "core/error.h"

namespace epmoe::run {
namespace {

std::string location(const std::filesystem::path& path, const YAML::Mark& mark) {
  // yaml-cpp counts lines from 0; editors count from 1.
  std::string text = path.string();
  if (!mark.is_null()) text += ':' + std::to_string(mark.line + 1);
  return text;
}

// Where each flattened key was first set, so a second setting of it (the
// same key twice in one map, or "remat: {x_sorted: ..}" and a dotted
// "remat.x_sorted: .." elsewhere) is refused: yaml-cpp keeps both pairs and
// a lookup silently takes the first, while the assignments would take the
// last, so the user cannot tell which one the run used.
using FirstSettings = std::map<std::string, std::string>;

void flatten(const std::filesystem::path& path, const YAML::Node& map, const std::string& prefix,
             std::vector<KeyAssignment>& assignments, FirstSettings& first_settings) {
  for (const auto& item : map) {
    const std::string key = prefix + item.first.as<std::string>();
    const YAML::Node& value = item.second;
    const std::string where = location(path, item.first.Mark());
    const auto [first, inserted] = first_settings.emplace(key, where);
    if (!inserted) {
      throw FileError(where + ": key '" + key + "' is set twice (first at " + first->second +
                      "); a config file sets each key once");
    }
    switch (value.Type()) {
      case YAML::NodeType::Map:
        flatten(path, value, key + ".", assignments, first_settings);
        break;
      case YAML::NodeType::Scalar:
        assignments.push_back({key, value.Scalar(), where});
        break;
      case YAML::NodeType::Sequence:
        throw FileError(where + ": key '" + key + "' holds a list; config values are scalars");
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined:
        throw FileError(where + ": key '" + key + "' has no value");
    }
  }
}

}  // namespace

static std::string read_regular_file(const std::filesystem::path& path) {
  // Only regular files: a FIFO would block the open (and the read) forever,
  // /dev/zero would never end. Checked before opening, and again on the
  // opened descriptor (O_NONBLOCK, so even a FIFO swapped in meanwhile
  // cannot block the open).
  if (path.empty()) throw FileError("--config '': the config file path is empty");
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (!std::filesystem::exists(status)) throw FileError(path.string() + ": no such file");
  if (std::filesystem::is_directory(status)) {
    throw FileError(path.string() + ": is a directory, not a YAML file");
  }
  if (!std::filesystem::is_regular_file(status)) {
    throw FileError(path.string() + ": not a regular file (a FIFO, socket or device); a YAML config is a file");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw FileError(path.string() + ": cannot open for reading: " + std::strerror(errno));
  struct stat opened {};
  if (::fstat(fd, &opened) != 0 || !S_ISREG(opened.st_mode)) {
    ::close(fd);
    throw FileError(path.string() + ": not a regular file; a YAML config is a file");
  }
  std::string text;
  char buffer[65536];
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int read_errno = errno;
      ::close(fd);
      throw FileError(path.string() + ": read failed: " + std::strerror(read_errno));
    }
    if (got == 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
  }
  ::close(fd);
  return text;
}

std::vector<KeyAssignment> load_yaml_overrides(const std::filesystem::path& path) {
  const std::string text = read_regular_file(path);
  YAML::Node root;
  try {
    // LoadAll, not Load: Load reads the first document and ignores the rest,
    // so settings after a '---' would be dropped without a word.
    const std::vector<YAML::Node> documents = YAML::LoadAll(text);
    if (documents.size() > 1) {
      throw FileError(path.string() + ": holds " + std::to_string(documents.size()) +
                      " YAML documents (separated by '---'); a config file is one map of keys");
    }
    if (!documents.empty()) root = documents.front();
  } catch (const YAML::ParserException& e) {
    throw FileError(location(path, e.mark) + ": malformed YAML: " + e.msg);
  }

  std::vector<KeyAssignment> assignments;
  if (!root.IsDefined() || root.IsNull()) return assignments;  // an empty file (or only comments)
  if (!root.IsMap()) {
    throw FileError(path.string() + ": expected a map of 'key: value' lines at the top level");
  }
  try {
    FirstSettings first_settings;
    flatten(path, root, "", assignments, first_settings);
  } catch (const YAML::Exception& e) {  // e.g. a key that is itself a list or map
    throw FileError(location(path, e.mark) + ": unsupported YAML: " + e.msg);
  }
  return assignments;
}

std::string non_empty_config_path(const std::string& path) {
  return path.empty() ? "the config file path is empty; give a YAML file or leave --config out" : "";
}

std::vector<KeyAssignment> command_assignments(const std::filesystem::path& config_file,
                                               const std::vector<std::string>& arguments, std::string_view command) {
  std::vector<KeyAssignment> assignments;
  if (!config_file.empty()) assignments = load_yaml_overrides(config_file);
  for (KeyAssignment& assignment : parse_assignments(arguments, command)) {
    assignments.push_back(std::move(assignment));  // after the file: the command line wins
  }
  return assignments;
}

}  // namespace epmoe::run
