// StagedOutputDir: the output files of one command appear in their directory
// as a set. Files are written into a hidden staging directory beside the
// output directory (same parent, hence same file system, so moving a file is
// an atomic rename), then moved into place with the completion marker (e.g.
// metrics.json) last. An old marker is removed before the first move, so a
// crash midway never leaves a mixture of old and new files that looks
// complete: the marker's presence means every file beside it is from the same
// run. If the command fails before commit(), the destructor removes the
// staging directory and the output directory is untouched (not even created).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace epmoe {

class StagedOutputDir {
 public:
  // Creates the staging directory (and the output directory's parent when
  // missing). Throws FileError when `output_dir` exists but is not a directory.
  explicit StagedOutputDir(const std::filesystem::path& output_dir);
  ~StagedOutputDir();  // removes the staging directory; never throws
  StagedOutputDir(const StagedOutputDir&) = delete;
  StagedOutputDir& operator=(const StagedOutputDir&) = delete;

  const std::filesystem::path& output_dir() const { return output_dir_; }
  // Where to write `file_name` now; it reaches output_dir() at commit().
  std::filesystem::path staged_path(const std::string& file_name) const;

  // Creates the output directory if missing, removes `completion_marker` and
  // `obsolete_file_names` (outputs of an earlier run that this run does not
  // produce) from it, then moves `file_names` and finally `completion_marker`
  // into it, and removes the (now empty) staging directory. Throws
  // FileError naming the file that could not be moved.
  void commit(const std::vector<std::string>& file_names, const std::string& completion_marker,
              const std::vector<std::string>& obsolete_file_names = {});

  // Throws FileError when `output_dir` exists and is not a directory; callers
  // use it to validate --out before doing any work.
  static void check_usable(const std::filesystem::path& output_dir);

 private:
  std::filesystem::path output_dir_;   // absolute, normalised
  std::filesystem::path staging_dir_;  // hidden sibling of output_dir_
};

}  // namespace epmoe
