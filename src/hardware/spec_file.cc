#include "hardware/spec_file.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <system_error>

#include "core/error.h"

namespace epmoe::hardware {
namespace {

struct FieldText {
  std::string value;
  int line = 0;  // from 1
};

void flatten(const std::filesystem::path& path, const YAML::Node& map, const std::string& prefix,
             std::map<std::string, FieldText>& out) {
  for (const auto& item : map) {
    const std::string name = prefix + item.first.as<std::string>();
    const int line = item.first.Mark().line + 1;
    const std::string where = path.string() + ":" + std::to_string(line);
    const YAML::Node& value = item.second;
    if (value.IsMap()) {
      flatten(path, value, name + ".", out);
    } else if (value.IsScalar()) {
      if (!out.emplace(name, FieldText{value.Scalar(), line}).second)
        throw FileError(where + ": field '" + name + "' is given twice");
    } else {
      throw FileError(where + ": field '" + name + "' must hold one value (a number or a word)");
    }
  }
}

}  // namespace

void read_spec_file(const std::filesystem::path& path, const std::string& kind, const std::vector<SpecField>& fields) {
  std::error_code status_error;
  const auto status = std::filesystem::status(path, status_error);
  if (!std::filesystem::exists(status))
    throw FileError(path.string() + ": no such " + kind + " file (and not a " + kind + " preset name)");
  // Only regular files: a FIFO would block the read forever, /dev/zero never ends.
  if (!std::filesystem::is_regular_file(status))
    throw FileError(path.string() + ": not a regular file (a directory, FIFO or device); a " + kind +
                    " spec is a YAML file");
  YAML::Node root;
  try {
    // LoadAll: LoadFile would read the first document and drop any after '---'.
    const std::vector<YAML::Node> documents = YAML::LoadAllFromFile(path.string());
    if (documents.size() > 1)
      throw FileError(path.string() + ": holds " + std::to_string(documents.size()) +
                      " YAML documents (separated by '---'); a " + kind + " spec is one map");
    if (!documents.empty()) root = documents.front();
  } catch (const YAML::ParserException& e) {
    throw FileError(path.string() + ":" + std::to_string(e.mark.line + 1) + ": malformed YAML: " + e.msg);
  } catch (const YAML::BadFile&) {
    throw FileError(path.string() + ": cannot open for reading");
  }
  if (!root.IsMap()) throw FileError(path.string() + ": expected a map of 'field: value' lines describing a " + kind);
  std::map<std::string, FieldText> given;
  flatten(path, root, "", given);

  std::set<std::string> known;
  std::string known_list;
  for (const SpecField& field : fields) {
    known.insert(field.name);
    known_list += (known_list.empty() ? "" : ", ") + field.name;
  }
  for (const auto& [name, text] : given) {
    if (!known.count(name))
      throw FileError(path.string() + ":" + std::to_string(text.line) + ": unknown " + kind + " field '" + name +
                      "' (known fields: " + known_list + ")");
  }
  for (const SpecField& field : fields) {
    const auto it = given.find(field.name);
    if (it == given.end()) {
      if (field.required)
        throw FileError(path.string() + ": missing " + kind + " field '" + field.name + "' (" + field.rule + ")");
      continue;
    }
    try {
      field.apply(it->second.value);
    } catch (const std::invalid_argument&) {
      throw FileError(path.string() + ":" + std::to_string(it->second.line) + ": " + field.name + "=" +
                      it->second.value + ": must be " + field.rule);
    } catch (const std::out_of_range&) {
      throw FileError(path.string() + ":" + std::to_string(it->second.line) + ": " + field.name + "=" +
                      it->second.value + ": must be " + field.rule);
    }
  }
}

long long parse_count(const std::string& text, long long min_value) {
  std::size_t used = 0;
  const long long value = std::stoll(text, &used);
  if (used != text.size() || value < min_value) throw std::invalid_argument(text);
  return value;
}

double parse_positive(const std::string& text) {
  std::size_t used = 0;
  const double value = std::stod(text, &used);
  if (used != text.size() || !(value > 0) || !std::isfinite(value)) throw std::invalid_argument(text);
  return value;
}

double parse_at_least(const std::string& text, double min_value) {
  const double value = parse_positive(text);
  if (!(value >= min_value)) throw std::invalid_argument(text);
  return value;
}

}  // namespace epmoe::hardware
