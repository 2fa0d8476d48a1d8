#include "data/staged_output_dir.h"

#include <unistd.h>

#include <system_error>

#include "core/error.h"

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

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what,
                       const std::error_code& error) {
  throw FileError(path.string() + ": " + what + ": " + error.message());
}

}  // namespace

void StagedOutputDir::check_usable(const std::filesystem::path& output_dir) {
  std::error_code error;
  const auto status = std::filesystem::status(output_dir, error);
  if (std::filesystem::exists(status) && !std::filesystem::is_directory(status)) {
    throw FileError(output_dir.string() + ": exists and is not a directory (--out needs a directory)");
  }
}

StagedOutputDir::StagedOutputDir(const std::filesystem::path& output_dir)
    : output_dir_(normalised_absolute(output_dir)) {
  check_usable(output_dir_);
  const std::filesystem::path parent = output_dir_.parent_path();
  std::error_code error;
  std::filesystem::create_directories(parent, error);
  if (error) fail(parent, "cannot create directory", error);
  std::string staging_name = ".";  // appended: GCC 12's -Wrestrict false positive on "." + string
  staging_name += output_dir_.filename().string() + ".staging-" + std::to_string(::getpid());
  staging_dir_ = parent / staging_name;
  std::filesystem::remove_all(staging_dir_, error);  // left by a crashed run with our pid
  std::filesystem::create_directory(staging_dir_, error);
  if (error) fail(staging_dir_, "cannot create the staging directory", error);
}

StagedOutputDir::~StagedOutputDir() {
  std::error_code ignored;  // a destructor never throws; a leftover is only litter
  std::filesystem::remove_all(staging_dir_, ignored);
}

std::filesystem::path StagedOutputDir::staged_path(const std::string& file_name) const {
  return staging_dir_ / file_name;
}

void StagedOutputDir::commit(const std::vector<std::string>& file_names,
                             const std::string& completion_marker,
                             const std::vector<std::string>& obsolete_file_names) {
  std::error_code error;
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
}

}  // namespace epmoe
