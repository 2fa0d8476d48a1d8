#include "data/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/file_error.h"

namespace epmoe {
namespace {

// Unique among threads of this process (counter) and among processes (pid),
// and hidden (leading dot) so that directory listings do not show it.
std::filesystem::path temporary_path_beside(const std::filesystem::path& path) {
  static std::atomic<unsigned long> counter{0};
  // Built by append: GCC 12 warns falsely (-Wrestrict, PR105651) on "." + string.
  std::string name = ".";
  name += path.filename().string();
  name += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  return path.parent_path() / name;
}

// Closes and removes the temporary file unless it was renamed into place.
class TemporaryFile {
 public:
  explicit TemporaryFile(std::filesystem::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  }
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(path_.c_str());
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

  bool is_open() const { return fd_ >= 0; }

  bool write_all(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t written = ::write(fd_, bytes.data(), bytes.size());
      if (written < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      bytes.remove_prefix(static_cast<std::size_t>(written));
    }
    return true;
  }

  // Flushes to disk (so a crash after the rename cannot leave an empty file
  // under the final name), closes, and renames over `target`.
  bool commit(const std::filesystem::path& target) {
    if (::fsync(fd_) != 0) return false;
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return false;
    if (::rename(path_.c_str(), target.c_str()) != 0) return false;
    renamed_ = true;
    return true;
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool renamed_ = false;
};

}  // namespace

void write_file_atomically(const std::filesystem::path& path, const std::vector<std::string_view>& pieces) {
  TemporaryFile temporary(temporary_path_beside(path));
  if (!temporary.is_open()) {
    const std::filesystem::path directory = path.has_parent_path() ? path.parent_path() : ".";
    throw_file_error(path, "cannot create a file in '" + directory.string() + "': " + errno_text());
  }
  for (std::string_view piece : pieces) {
    if (!temporary.write_all(piece)) {
      throw_file_error(path, "write failed: " + errno_text());
    }
  }
  if (!temporary.commit(path)) {
    throw_file_error(path, "write failed: " + errno_text());
  }
}

}  // namespace epmoe
