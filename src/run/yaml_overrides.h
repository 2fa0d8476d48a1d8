// Config files: a YAML map of keys to scalar values, read as the same
// key=value assignments the command line gives, so both go through one
// validation (run/config_keys.h). Nested maps flatten to dotted keys:
//
//   top_k: 2                 -> top_k=2
//   remat:
//     x_sorted: remat        -> remat.x_sorted=remat
//
// Each assignment's origin is "file.yaml:LINE", so a bad value is reported
// where it was written.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "run/config_keys.h"

namespace epmoe::run {

// FileError (naming the file, and the line when known) for a missing or
// unreadable file, malformed YAML, a top level that is not a map, a list
// value or a key without a value. Keys are not checked here; the command's
// KeyRegistry does that. An empty file gives no assignments.
std::vector<KeyAssignment> load_yaml_overrides(const std::filesystem::path& path);

// A command's key assignments: the YAML file's (when `config_file` is not
// empty), then the command line's key=value arguments, which come later and
// win. ConfigError / FileError as above; keys are checked by the registry.
// For CLI11's Option::check on --config: "" when `path` is usable as a path,
// else why not. `--config ""` would otherwise read as "no config file" and
// the run would go ahead without the settings the user meant to give.
std::string non_empty_config_path(const std::string& path);

std::vector<KeyAssignment> command_assignments(const std::filesystem::path& config_file,
                                               const std::vector<std::string>& arguments, std::string_view command);

}  // namespace epmoe::run
