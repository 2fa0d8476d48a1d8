#include "cli/yaml_overrides.h"

#include <yaml-cpp/yaml.h>

#include <string>
#include <system_error>

#include "core/error.h"

namespace epmoe::cli {
namespace {

std::string location(const std::filesystem::path& path, const YAML::Mark& mark) {
  // yaml-cpp counts lines from 0; editors count from 1.
  std::string text = path.string();
  if (!mark.is_null()) text += ':' + std::to_string(mark.line + 1);
  return text;
}

void flatten(const std::filesystem::path& path, const YAML::Node& map, const std::string& prefix,
             std::vector<KeyAssignment>& assignments) {
  for (const auto& item : map) {
    const std::string key = prefix + item.first.as<std::string>();
    const YAML::Node& value = item.second;
    const std::string where = location(path, item.first.Mark());
    switch (value.Type()) {
      case YAML::NodeType::Map:
        flatten(path, value, key + ".", assignments);
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

std::vector<KeyAssignment> load_yaml_overrides(const std::filesystem::path& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (!std::filesystem::exists(status)) throw FileError(path.string() + ": no such file");
  if (std::filesystem::is_directory(status)) {
    throw FileError(path.string() + ": is a directory, not a YAML file");
  }

  YAML::Node root;
  try {
    root = YAML::LoadFile(path.string());
  } catch (const YAML::ParserException& e) {
    throw FileError(location(path, e.mark) + ": malformed YAML: " + e.msg);
  } catch (const YAML::BadFile&) {
    throw FileError(path.string() + ": cannot open for reading");
  }

  std::vector<KeyAssignment> assignments;
  if (root.IsNull()) return assignments;  // an empty file (or only comments)
  if (!root.IsMap()) {
    throw FileError(path.string() + ": expected a map of 'key: value' lines at the top level");
  }
  try {
    flatten(path, root, "", assignments);
  } catch (const YAML::Exception& e) {  // e.g. a key that is itself a list or map
    throw FileError(location(path, e.mark) + ": unsupported YAML: " + e.msg);
  }
  return assignments;
}

std::vector<KeyAssignment> command_assignments(const std::filesystem::path& config_file,
                                               const std::vector<std::string>& arguments,
                                               std::string_view command) {
  std::vector<KeyAssignment> assignments;
  if (!config_file.empty()) assignments = load_yaml_overrides(config_file);
  for (KeyAssignment& assignment : parse_assignments(arguments, command)) {
    assignments.push_back(std::move(assignment));  // after the file: the command line wins
  }
  return assignments;
}

}  // namespace epmoe::cli
