#include "data/staged_output_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "core/error.h"
#include "data/output_paths.h"

namespace epmoe {
namespace {

std::filesystem::path normalised_absolute(const std::filesystem::path& path) {
  std::filesystem::path normal = std::filesystem::absolute(path).lexically_normal();
  // "out/" normalises to "out/" whose filename is empty; drop the separator.
  if (!normal.has_filename() && normal.has_parent_path() && normal != normal.root_path()) {
    normal = normal.parent_path();
  }
  return normal;
}

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what, const std::error_code& error) {
  throw FileError(path.string() + ": " + what + ": " + error.message());
}

[[noreturn]] void fail_errno(const std::filesystem::path& path, const std::string& what) {
  fail(path, what, std::error_code(errno, std::generic_category()));
}

// "." + name + suffix: the hidden siblings of the output directory.
std::filesystem::path sibling(const std::filesystem::path& output_dir, const std::string& suffix) {
  std::string name = ".";  // appended: GCC 12's -Wrestrict false positive on "." + string
  name += output_dir.filename().string() + suffix;
  return output_dir.parent_path() / name;
}

// The validated absolute form of an --out path (FileError when empty or the
// root directory, which has no parent to stage beside).
std::filesystem::path usable_absolute(const std::filesystem::path& output_dir) {
  if (output_dir.empty()) {
    throw FileError("--out '': the output directory path is empty (--out needs a directory)");
  }
  const std::filesystem::path absolute = normalised_absolute(output_dir);
  if (!absolute.has_filename() || absolute == absolute.root_path()) {
    throw FileError(output_dir.string() + ": cannot be the output directory (it has no parent to stage beside)");
  }
  return absolute;
}

bool process_is_dead(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace

void StagedOutputDir::check_usable(const std::filesystem::path& output_dir) {
  const std::filesystem::path absolute = usable_absolute(output_dir);
  std::error_code error;
  const auto status = std::filesystem::status(absolute, error);
  if (std::filesystem::exists(status) && !std::filesystem::is_directory(status)) {
    throw FileError(output_dir.string() + ": exists and is not a directory (--out needs a directory)");
  }
  // The staging directory and the lock file are created in the parent, so
  // the parent (or, when it is missing, its nearest existing ancestor, where
  // the missing directories will be created) must accept new entries.
  check_can_create(absolute, output_dir.string(), "--out needs a writable location");
  if (std::filesystem::is_directory(status) && ::access(absolute.c_str(), W_OK | X_OK) != 0) {
    throw FileError(output_dir.string() + ": not writable: " + std::strerror(errno));
  }
}

StagedOutputDir::StagedOutputDir(const std::filesystem::path& output_dir) : output_dir_(usable_absolute(output_dir)) {
  check_usable(output_dir_);
  const std::filesystem::path parent = output_dir_.parent_path();
  for (std::filesystem::path missing = parent;
       !std::filesystem::exists(missing) && missing.has_parent_path() && missing != missing.root_path();
       missing = missing.parent_path()) {
    created_parents_.push_back(missing);
  }
  lock_path_ = sibling(output_dir_, ".lock");
  try {
    std::error_code error;
    std::filesystem::create_directories(parent, error);
    if (error) fail(parent, "cannot create directory", error);
    take_lock();
    remove_stale_staging_dirs();
    staging_dir_ = sibling(output_dir_, ".staging-" + std::to_string(::getpid()));
    std::filesystem::remove_all(staging_dir_, error);  // left by a crashed run with our pid
    std::filesystem::create_directory(staging_dir_, error);
    if (error) fail(staging_dir_, "cannot create the staging directory", error);
  } catch (...) {
    release();  // the destructor of a half-built object is not run
    throw;
  }
}

void StagedOutputDir::take_lock() {
  for (;;) {
    const int fd = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fail_errno(lock_path_, "cannot create the lock file");
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int lock_errno = errno;
      char holder[32] = {};
      const ssize_t read_bytes = ::pread(fd, holder, sizeof holder - 1, 0);
      ::close(fd);
      if (lock_errno != EWOULDBLOCK) {
        errno = lock_errno;
        fail_errno(lock_path_, "cannot lock");
      }
      const std::string pid = read_bytes > 0 ? std::string(holder, static_cast<std::size_t>(read_bytes)) : "unknown";
      throw FileError(output_dir_.string() + ": another epmoe process (pid " + pid +
                      ") is writing this directory (lock " + lock_path_.string() +
                      "); wait for it to finish or choose another --out");
    }
    // The previous holder unlinks the file before it unlocks; if that
    // happened between our open and flock, we hold a lock on a file nobody
    // else can find, so start over with the file that is there now.
    struct stat held {
    }, current{};
    if (::fstat(fd, &held) == 0 && ::stat(lock_path_.c_str(), &current) == 0 && held.st_dev == current.st_dev &&
        held.st_ino == current.st_ino) {
      lock_fd_ = fd;
      break;
    }
    ::close(fd);
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, pid.data(), pid.size(), 0) < 0) {
    fail_errno(lock_path_, "cannot write the lock file");
  }
}

void StagedOutputDir::remove_stale_staging_dirs() const {
  // Only with the lock held: a live writer of this directory would hold it,
  // so a staging directory whose pid is gone is a crashed run's leftover.
  const std::string prefix = sibling(output_dir_, ".staging-").filename().string();
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(output_dir_.parent_path(), error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string pid_text = name.substr(prefix.size());
    if (pid_text.size() > 9 || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    std::error_code ignored;
    if (pid != ::getpid() && process_is_dead(pid)) std::filesystem::remove_all(entry.path(), ignored);
  }
}

StagedOutputDir::~StagedOutputDir() { release(); }

void StagedOutputDir::release() noexcept {
  std::error_code ignored;  // a destructor never throws; a leftover is only litter
  if (!staging_dir_.empty()) std::filesystem::remove_all(staging_dir_, ignored);
  staging_dir_.clear();
  if (lock_fd_ >= 0) {
    // Unlinked before it is unlocked, so the next writer never locks a file
    // that is about to disappear (take_lock checks for that).
    ::unlink(lock_path_.c_str());
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
  if (!committed_) {
    for (const std::filesystem::path& created : created_parents_) {
      if (!std::filesystem::remove(created, ignored)) break;  // not empty: someone else uses it
    }
  }
  created_parents_.clear();
}

std::filesystem::path StagedOutputDir::staged_path(const std::string& file_name) const {
  return staging_dir_ / file_name;
}

void StagedOutputDir::commit(const std::vector<std::string>& file_names, const std::string& completion_marker,
                             const std::vector<std::string>& obsolete_file_names) {
  std::error_code error;
  committed_ = true;  // from here on the parents hold (part of) an output
  std::filesystem::create_directories(output_dir_, error);
  if (error) fail(output_dir_, "cannot create directory", error);

  std::vector<std::string> removed = obsolete_file_names;
  if (!completion_marker.empty()) removed.insert(removed.begin(), completion_marker);
  for (const std::string& name : removed) {
    std::filesystem::remove(output_dir_ / name, error);
    if (error) fail(output_dir_ / name, "cannot remove the old file", error);
  }

  std::vector<std::string> moved = file_names;
  if (!completion_marker.empty()) moved.push_back(completion_marker);
  for (const std::string& name : moved) {
    std::filesystem::rename(staging_dir_ / name, output_dir_ / name, error);
    if (error) fail(output_dir_ / name, "cannot move into place", error);
  }
  std::filesystem::remove_all(staging_dir_, error);  // empty now; a leftover is only litter
  release();                                         // done: the next writer may go ahead
}

}  // namespace epmoe
