// Model and hardware descriptions as YAML files: a flat map of `field: value`
// lines (nested maps flatten to dotted names, as for command keys). Each field
// is declared once in a table with its meaning; a file that names an unknown
// field, leaves out a required one or gives a value of the wrong kind fails
// with a FileError naming the file, the line and the field.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace epmoe::hardware {

// One field of a spec file: `apply` stores the parsed value; it throws
// std::invalid_argument (caught and turned into a FileError) when the text is
// not a valid value.
struct SpecField {
  std::string name;
  bool required = true;
  std::string rule;  // "integer >= 1", "GB > 0", ... quoted in messages
  std::function<void(const std::string& text)> apply;
};

// Reads `path` and applies every field it holds. FileError for a missing or
// malformed file, an unknown field (with the list of known ones), a missing
// required field, or a value its field rejects.
void read_spec_file(const std::filesystem::path& path, const std::string& kind, const std::vector<SpecField>& fields);

// Value parsers for SpecField::apply; throw std::invalid_argument with the rule.
long long parse_count(const std::string& text, long long min_value);
double parse_positive(const std::string& text);
double parse_at_least(const std::string& text, double min_value);  // finite, >= min_value

}  // namespace epmoe::hardware
