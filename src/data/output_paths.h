// The preflight of a run's outputs: every path a command or a layer object
// will write (trace_file, metrics_file, checkpoint_dir, --out) is checked
// before any compute, so a path that cannot be written costs nothing and
// leaves nothing: before, an unwritable trace_file let `epmoe layer` write
// all of --out and `epmoe train` run every step and commit its checkpoint
// before exiting 2, and a directory given as trace_file left PATH.tmp beside
// it. Used by `epmoe layer`, `epmoe train` and WholeWorldLayer.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace epmoe {

struct OutputPath {
  enum class Kind {
    file,              // written whole (atomically: a temporary beside it, renamed) or appended to
    directory,         // created if missing, files written inside
    staged_directory,  // --out (data/staged_output_dir.h: staged beside it, locked)
  };
  std::string name;  // as the user gave it: "trace_file", "metrics_file", "checkpoint_dir", "--out"
  std::filesystem::path path;
  Kind kind = Kind::file;
};

// In order; FileError naming "<name>=<path>" and the rule for the first path
// that cannot be written: a file path that is a directory or another
// non-regular file, a directory path that is a file, a path below a
// non-directory, a location that takes no new entry (read-only, no
// permission), an existing file that is not writable. Empty paths (an
// output turned off) are skipped. Creates nothing that outlives the call.
void check_output_paths(const std::vector<OutputPath>& outputs);

// The primitive shared with StagedOutputDir::check_usable: new entries can be
// created at `path` (in its parent, or where the missing directories above
// it will be created: its nearest existing ancestor). Tried with a real
// mkdir: access() answers yes to root even where mkdir fails (/proc, a
// read-only bind mount). FileError "<what>: ..." otherwise, ending
// " (<hint>)" when a hint is given.
void check_can_create(const std::filesystem::path& path, const std::string& what, const std::string& hint = "");

}  // namespace epmoe
