// Config keys: every setting of an epmoe command is a `key=value` pair with a
// declared type, default, bounds and one-line help. Keys are declared in
// tables (KeyGroup); a command's KeyRegistry is built from the groups it
// accepts, so a group such as the MoE layer keys is declared once and shared
// by `epmoe layer` and `epmoe train` (epmoe-bench builds its own). Command-line arguments and
// YAML files (run/yaml_overrides.h) are validated by the same code, so a
// value means the same thing wherever it comes from.
//
// Adding a key: append a KeySpec to the group it belongs to, e.g.
//   {.name = "capacity_factor", .type = KeyType::real, .default_value = "0",
//    .help = "expert capacity as a multiple of N*K/E; 0 = never drop", .min_value = 0},
// then read it with values.get_float("capacity_factor"). `--help` and the
// metrics' config echo pick it up from the table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

namespace epmoe::run {

enum class KeyType { integer, real, boolean, choice, text };

struct KeySpec {
  // Every member has an initializer so tables can name only what they need.
  std::string name = {};  // snake_case; nested groups use dots: "remat.x_sorted"
  KeyType type = KeyType::integer;
  std::string default_value = {};         // written as on the command line; validated like user input
  std::string help = {};                  // one line
  std::vector<std::string> choices = {};  // KeyType::choice: the allowed values
  std::optional<double> min_value = {};   // integer / real: inclusive bound ...
  bool min_exclusive = false;             // ... or exclusive ("must be > 0")
  std::optional<double> max_value = {};   // integer / real: inclusive bound
};

// Keys that belong together, shared between commands; the title heads their
// block in --help.
struct KeyGroup {
  std::string title;
  std::vector<KeySpec> keys;
};

using KeyValue = std::variant<std::int64_t, double, bool, std::string>;

// One `key=value` setting and where it came from, for messages: empty for the
// command line, "layer.yaml:4" for a file.
struct KeyAssignment {
  std::string key;
  std::string value;
  std::string origin;
};

// The validated values of every key of one command, defaults included, in
// declaration order. Getters take the key's declared name; asking for an
// undeclared key or the wrong type is a bug (InternalError).
class ConfigValues {
 public:
  struct Entry {
    std::string name;
    KeyType type;
    KeyValue value;
    bool explicitly_set = false;  // false: the declared default
  };

  std::int64_t get_int(std::string_view key) const;
  // The value as an int; ConfigError when it does not fit (e.g. top_k=4294967298).
  int get_int32(std::string_view key) const;
  double get_float(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;  // choice and text keys
  bool is_set(std::string_view key) const;
  // "key=value" as the value stands (for messages).
  std::string setting(std::string_view key) const;

  const std::vector<Entry>& entries() const { return entries_; }

 private:
  friend class KeyRegistry;
  const Entry& entry(std::string_view key) const;
  Entry& entry(std::string_view key);

  std::vector<Entry> entries_;
  std::unordered_map<std::string, std::size_t> index_by_name_;
};

class KeyRegistry {
 public:
  // `program` and `command` ("layer") are named in messages: "(epmoe layer
  // --help lists every key)". Duplicate names or invalid defaults in the
  // tables are bugs (InternalError).
  KeyRegistry(const std::string& command, std::vector<KeyGroup> groups, const std::string& program = "epmoe");
  // Not copyable: the name index points into groups_.
  KeyRegistry(const KeyRegistry&) = delete;
  KeyRegistry& operator=(const KeyRegistry&) = delete;

  const std::vector<KeyGroup>& groups() const { return groups_; }
  const KeySpec* find(std::string_view name) const;  // null when unknown

  ConfigValues defaults() const;
  // Applies the assignments in order to the defaults (a later one wins, so a
  // command-line value overrides a YAML one when it comes after it).
  // ConfigError naming the origin, key, value and rule.
  ConfigValues parse(const std::vector<KeyAssignment>& assignments) const;
  void apply(ConfigValues& values, const KeyAssignment& assignment) const;

  // Every key as "name  type  default  help", grouped, for --help.
  std::string help_text() const;

 private:
  std::string unknown_key_message(const std::string& key) const;

  std::string command_;  // "epmoe layer"
  std::vector<KeyGroup> groups_;
  std::unordered_map<std::string, const KeySpec*> spec_by_name_;  // into groups_
};

// "top_k=3" -> {"top_k", "3", ""}; ConfigError when there is no '=' or no key
// (naming `program` `command` --help).
KeyAssignment parse_assignment(std::string_view argument, std::string_view command, std::string_view program = "epmoe");
std::vector<KeyAssignment> parse_assignments(const std::vector<std::string>& arguments, std::string_view command,
                                             std::string_view program = "epmoe");

// How a type reads in --help: "int", "int >= 1", "float > 0", "bool",
// "softmax_topk|sigmoid_grouped|random", "string".
std::string describe_type(const KeySpec& spec);

// Edit distance (with transpositions) for "did you mean" suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace epmoe::run
