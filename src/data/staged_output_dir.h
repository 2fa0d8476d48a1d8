// StagedOutputDir: the output files of one command appear in their directory
// as a set. Files are written into a hidden staging directory beside the
// output directory (same parent, hence same file system, so moving a file is
// an atomic rename), then moved into place with the completion marker (e.g.
// metrics.json) last. An old marker is removed before the first move, so a
// crash midway never leaves a mixture of old and new files that looks
// complete: the marker's presence means every file beside it is from the same
// run. If the command fails before commit(), the destructor removes the
// staging directory (and any parent directory it created) and the output
// directory is untouched (not even created).
//
// Concurrent writers: the marker alone cannot keep two runs apart (both
// remove it, both move files, the second marker vouches for a mixture), so
// a StagedOutputDir holds an exclusive flock on a hidden lock file beside
// the output directory (".NAME.lock", holding the owner's pid) from its
// construction to the end of commit() (or its destruction). A second writer for the same directory is
// refused at construction with a FileError naming the holder's pid, before it
// has written anything. The kernel drops the lock when a process dies, so a
// crashed run never blocks the next one; staging directories of dead
// processes are removed by the next writer.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace epmoe {

class StagedOutputDir {
 public:
  // Takes the lock, creates the staging directory (and the output
  // directory's parent when missing). Throws FileError when `output_dir` is
  // unusable (see check_usable) or another process holds the lock.
  explicit StagedOutputDir(const std::filesystem::path& output_dir);
  ~StagedOutputDir();  // removes the staging directory, releases the lock; never throws
  StagedOutputDir(const StagedOutputDir&) = delete;
  StagedOutputDir& operator=(const StagedOutputDir&) = delete;

  const std::filesystem::path& output_dir() const { return output_dir_; }
  // Where to write `file_name` now; it reaches output_dir() at commit().
  std::filesystem::path staged_path(const std::string& file_name) const;

  // Creates the output directory if missing, removes `completion_marker` and
  // `obsolete_file_names` (outputs of an earlier run that this run does not
  // produce) from it, then moves `file_names` and finally `completion_marker`
  // into it, removes the (now empty) staging directory and releases the
  // lock. Throws FileError naming the file that could not be moved.
  void commit(const std::vector<std::string>& file_names, const std::string& completion_marker,
              const std::vector<std::string>& obsolete_file_names = {});

  // Callers use it to validate --out before doing any work; creates nothing
  // that outlives the call. FileError when `output_dir` is empty, exists and
  // is not a directory, has a non-directory ancestor, or when neither it nor
  // its nearest existing ancestor accepts new entries (read-only, no
  // permission).
  static void check_usable(const std::filesystem::path& output_dir);

 private:
  void take_lock();
  void remove_stale_staging_dirs() const;
  void release() noexcept;  // what the destructor does; also for a constructor that throws

  std::filesystem::path output_dir_;   // absolute, normalised
  std::filesystem::path staging_dir_;  // hidden sibling of output_dir_
  std::filesystem::path lock_path_;    // hidden sibling of output_dir_
  int lock_fd_ = -1;                   // holds the flock while open
  // Ancestors this instance created (deepest first), removed again when
  // empty if nothing was committed, so a refused run leaves no trace.
  std::vector<std::filesystem::path> created_parents_;
  bool committed_ = false;
};

}  // namespace epmoe
