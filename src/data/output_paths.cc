#include "data/output_paths.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "core/error.h"
#include "data/staged_output_dir.h"

namespace epmoe {
namespace {

void check_file(const std::string& what, const std::filesystem::path& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (std::filesystem::is_directory(status)) throw FileError(what + ": is a directory; name a file");
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    // A file is replaced by a rename: over a device or a FIFO that would
    // replace the node itself.
    throw FileError(what + ": exists and is not a regular file");
  }
  check_can_create(path, what);  // the temporary beside it, or the file itself
  if (std::filesystem::exists(status)) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);  // changes no byte
    if (fd < 0) throw FileError(what + ": not writable: " + std::strerror(errno));
    ::close(fd);
  }
}

void check_directory(const std::string& what, const std::filesystem::path& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (std::filesystem::exists(status) && !std::filesystem::is_directory(status)) {
    throw FileError(what + ": exists and is not a directory");
  }
  // Existing: files go inside it (probed there); missing: it is created in
  // its nearest existing ancestor.
  check_can_create(std::filesystem::is_directory(status) ? path / ".epmoe" : path, what);
}

}  // namespace

void check_can_create(const std::filesystem::path& path, const std::string& what, const std::string& hint) {
  const std::string because = hint.empty() ? std::string() : " (" + hint + ")";
  const std::filesystem::path absolute = std::filesystem::absolute(path).lexically_normal();
  std::error_code error;
  std::filesystem::path ancestor = absolute.parent_path();
  for (;;) {
    const auto status = std::filesystem::status(ancestor, error);
    if (std::filesystem::exists(status)) {
      if (!std::filesystem::is_directory(status))
        throw FileError(what + ": " + ancestor.string() + " is not a directory" + because);
      break;
    }
    if (ancestor == ancestor.root_path() || !ancestor.has_parent_path()) break;
    ancestor = ancestor.parent_path();
  }
  std::string probe_name = ".";
  probe_name += absolute.filename().string() + ".probe-" + std::to_string(::getpid());
  const std::filesystem::path probe = ancestor / probe_name;
  if (::mkdir(probe.c_str(), 0700) != 0 && errno != EEXIST) {
    throw FileError(what + ": cannot create files in " + ancestor.string() + ": " + std::strerror(errno) + because);
  }
  ::rmdir(probe.c_str());
}

void check_output_paths(const std::vector<OutputPath>& outputs) {
  for (const OutputPath& output : outputs) {
    if (output.path.empty()) continue;
    const std::string what = output.name + "=" + output.path.string();
    switch (output.kind) {
      case OutputPath::Kind::file:
        check_file(what, output.path);
        break;
      case OutputPath::Kind::directory:
        check_directory(what, output.path);
        break;
      case OutputPath::Kind::staged_directory:
        StagedOutputDir::check_usable(output.path);
        break;
    }
  }
}

}  // namespace epmoe
