#include "run/config_keys.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace epmoe::run {
namespace {

std::string format_number(double value) {
  // Whole bounds print exactly ("must be <= 86400000", not "8.64e+07").
  if (std::abs(value) < 1e15 && value == std::floor(value)) {
    return std::to_string(static_cast<std::int64_t>(value));
  }
  std::ostringstream text;
  text << value;
  return text.str();
}

std::string join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string joined;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    joined += (i ? std::string(separator) : "") + parts[i];
  }
  return joined;
}

std::string prefix_origin(const std::string& origin, const std::string& message) {
  return origin.empty() ? message : origin + ": " + message;
}

// Why `text` is not a valid value of `spec`, or nullopt with `value` set.
std::optional<std::string> parse_value(const KeySpec& spec, std::string_view text, KeyValue& value) {
  switch (spec.type) {
    case KeyType::integer: {
      std::int64_t parsed = 0;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
      if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
        return error == std::errc::result_out_of_range ? "out of the 64-bit integer range" : "expected an integer";
      }
      value = parsed;
      break;
    }
    case KeyType::real: {
      double parsed = 0;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
      if (text.empty() || error != std::errc() || end != text.data() + text.size() || !std::isfinite(parsed)) {
        return "expected a finite number";
      }
      value = parsed;
      break;
    }
    case KeyType::boolean:
      if (text == "true" || text == "1") {
        value = true;
      } else if (text == "false" || text == "0") {
        value = false;
      } else {
        return "expected true, false, 1 or 0";
      }
      break;
    case KeyType::choice:
      if (std::find(spec.choices.begin(), spec.choices.end(), text) == spec.choices.end()) {
        return "expected one of " + join(spec.choices, ", ");
      }
      value = std::string(text);
      break;
    case KeyType::text:
      value = std::string(text);
      break;
  }

  if (spec.type == KeyType::integer || spec.type == KeyType::real) {
    const double number =
        spec.type == KeyType::integer ? static_cast<double>(std::get<std::int64_t>(value)) : std::get<double>(value);
    if (spec.min_value && (spec.min_exclusive ? number <= *spec.min_value : number < *spec.min_value)) {
      return std::string("must be ") + (spec.min_exclusive ? "> " : ">= ") + format_number(*spec.min_value);
    }
    if (spec.max_value && number > *spec.max_value) {
      return "must be <= " + format_number(*spec.max_value);
    }
  }
  return std::nullopt;
}

const char* type_mismatch_name(KeyType type) {
  switch (type) {
    case KeyType::integer:
      return "integer";
    case KeyType::real:
      return "real";
    case KeyType::boolean:
      return "boolean";
    case KeyType::choice:
      return "choice";
    case KeyType::text:
      return "text";
  }
  return "?";
}

}  // namespace

// --- ConfigValues ------------------------------------------------------------

const ConfigValues::Entry& ConfigValues::entry(std::string_view key) const {
  const auto found = index_by_name_.find(std::string(key));
  if (found == index_by_name_.end()) {
    throw InternalError("config key '" + std::string(key) + "' is read but never declared");
  }
  return entries_[found->second];
}

ConfigValues::Entry& ConfigValues::entry(std::string_view key) {
  return const_cast<Entry&>(static_cast<const ConfigValues&>(*this).entry(key));
}

template <typename T>
static const T& get_as(const ConfigValues::Entry& entry) {
  if (const T* value = std::get_if<T>(&entry.value)) return *value;
  throw InternalError("config key '" + entry.name + "' is declared " + type_mismatch_name(entry.type) +
                      " but read as another type");
}

std::int64_t ConfigValues::get_int(std::string_view key) const { return get_as<std::int64_t>(entry(key)); }

int ConfigValues::get_int32(std::string_view key) const {
  const std::int64_t value = get_int(key);
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    throw ConfigError(std::string(key) + "=" + std::to_string(value) +
                      ": must be <= " + std::to_string(std::numeric_limits<int>::max()));
  }
  return static_cast<int>(value);
}

double ConfigValues::get_float(std::string_view key) const { return get_as<double>(entry(key)); }
bool ConfigValues::get_bool(std::string_view key) const { return get_as<bool>(entry(key)); }
const std::string& ConfigValues::get_string(std::string_view key) const { return get_as<std::string>(entry(key)); }
std::string ConfigValues::setting(std::string_view key) const {
  std::ostringstream text;
  text << key << "=";
  std::visit(
      [&](const auto& value) {
        if constexpr (std::is_same_v<std::decay_t<decltype(value)>, bool>) {
          text << (value ? "true" : "false");
        } else {
          text << value;
        }
      },
      entry(key).value);
  return text.str();
}

bool ConfigValues::is_set(std::string_view key) const { return entry(key).explicitly_set; }

// --- KeyRegistry -------------------------------------------------------------

KeyRegistry::KeyRegistry(const std::string& command, std::vector<KeyGroup> groups, const std::string& program)
    : command_(program + " " + command), groups_(std::move(groups)) {
  for (const KeyGroup& group : groups_) {
    for (const KeySpec& spec : group.keys) {
      if (!spec_by_name_.emplace(spec.name, &spec).second) {
        throw InternalError(command_ + ": config key '" + spec.name + "' declared twice");
      }
      KeyValue ignored;
      if (const auto why = parse_value(spec, spec.default_value, ignored)) {
        throw InternalError(command_ + ": default " + spec.name + "=" + spec.default_value + " is invalid: " + *why);
      }
    }
  }
}

const KeySpec* KeyRegistry::find(std::string_view name) const {
  const auto found = spec_by_name_.find(std::string(name));
  return found == spec_by_name_.end() ? nullptr : found->second;
}

ConfigValues KeyRegistry::defaults() const {
  ConfigValues values;
  for (const KeyGroup& group : groups_) {
    for (const KeySpec& spec : group.keys) {
      KeyValue value;
      parse_value(spec, spec.default_value, value);  // checked in the constructor
      values.index_by_name_.emplace(spec.name, values.entries_.size());
      values.entries_.push_back({spec.name, spec.type, std::move(value), false});
    }
  }
  return values;
}

ConfigValues KeyRegistry::parse(const std::vector<KeyAssignment>& assignments) const {
  ConfigValues values = defaults();
  for (const KeyAssignment& assignment : assignments) apply(values, assignment);
  return values;
}

void KeyRegistry::apply(ConfigValues& values, const KeyAssignment& assignment) const {
  const KeySpec* spec = find(assignment.key);
  if (spec == nullptr) {
    throw ConfigError(prefix_origin(assignment.origin, unknown_key_message(assignment.key)));
  }
  KeyValue value;
  if (const auto why = parse_value(*spec, assignment.value, value)) {
    throw ConfigError(prefix_origin(assignment.origin, assignment.key + "=" + assignment.value + ": " + *why));
  }
  ConfigValues::Entry& entry = values.entry(spec->name);
  entry.value = std::move(value);
  entry.explicitly_set = true;
}

std::string KeyRegistry::unknown_key_message(const std::string& key) const {
  // Suggest the closest declared key when it is a plausible typo: at most two
  // edits, or a third of the key's length for long keys.
  const std::size_t max_distance = std::max<std::size_t>(2, key.size() / 3);
  const KeySpec* closest = nullptr;
  std::size_t closest_distance = max_distance + 1;
  for (const KeyGroup& group : groups_) {
    for (const KeySpec& spec : group.keys) {
      const std::size_t distance = edit_distance(key, spec.name);
      if (distance < closest_distance) {
        closest = &spec;
        closest_distance = distance;
      }
    }
  }
  std::string message = "unknown key '" + key + "'";
  if (closest != nullptr) message += "; did you mean '" + closest->name + "'?";
  return message + " (" + command_ + " --help lists every key)";
}

std::string KeyRegistry::help_text() const {
  std::size_t name_width = 3, type_width = 4, default_width = 7;  // at least the column headers
  for (const KeyGroup& group : groups_) {
    for (const KeySpec& spec : group.keys) {
      name_width = std::max(name_width, spec.name.size());
      type_width = std::max(type_width, describe_type(spec).size());
      default_width = std::max(default_width, spec.default_value.size());
    }
  }
  const auto pad = [](const std::string& text, std::size_t width) {
    return text + std::string(width - text.size() + 2, ' ');
  };
  std::string text = "Keys (key=value; later ones win):\n";
  for (const KeyGroup& group : groups_) {
    text += "\n  " + group.title + ":\n";
    text += "    " + pad("key", name_width) + pad("type", type_width) + pad("default", default_width) + "meaning\n";
    for (const KeySpec& spec : group.keys) {
      text += "    " + pad(spec.name, name_width) + pad(describe_type(spec), type_width) +
              pad(spec.default_value, default_width) + spec.help + "\n";
    }
  }
  return text;
}

// --- free functions ----------------------------------------------------------

KeyAssignment parse_assignment(std::string_view argument, std::string_view command, std::string_view program) {
  const std::size_t equals = argument.find('=');
  if (equals == std::string_view::npos || equals == 0) {
    throw ConfigError("'" + std::string(argument) + "': expected key=value (" + std::string(program) + " " +
                      std::string(command) + " --help lists every key)");
  }
  return {std::string(argument.substr(0, equals)), std::string(argument.substr(equals + 1)), ""};
}

std::vector<KeyAssignment> parse_assignments(const std::vector<std::string>& arguments, std::string_view command,
                                             std::string_view program) {
  std::vector<KeyAssignment> assignments;
  assignments.reserve(arguments.size());
  for (const std::string& argument : arguments) {
    assignments.push_back(parse_assignment(argument, command, program));
  }
  return assignments;
}

std::string describe_type(const KeySpec& spec) {
  std::string text;
  switch (spec.type) {
    case KeyType::integer:
      text = "int";
      break;
    case KeyType::real:
      text = "float";
      break;
    case KeyType::boolean:
      return "bool";
    case KeyType::choice:
      return join(spec.choices, "|");
    case KeyType::text:
      return "string";
  }
  if (spec.min_value) {
    text += (spec.min_exclusive ? " > " : " >= ") + format_number(*spec.min_value);
  }
  if (spec.max_value) text += " <= " + format_number(*spec.max_value);
  return text;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Optimal string alignment: insertions, deletions, substitutions and
  // adjacent transpositions ("tpo_k") each cost one.
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitution = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + substitution});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace epmoe::run
