#include "data/checkpoint_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>

#include "core/error.h"
#include "core/file_error.h"
#include "data/atomic_file.h"
#include "data/npy.h"

namespace epmoe {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kStepPrefix = "step_";
constexpr std::string_view kStagingPrefix = ".staging_step_";
// A checkpoint being deleted is renamed to this first (see remove_all_but_latest).
constexpr std::string_view kRemovingPrefix = ".removing_step_";

std::string hex32(std::uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08" PRIx32, value);
  return text;
}

std::string step_name(std::string_view prefix, std::int64_t step) {
  char digits[32];
  std::snprintf(digits, sizeof(digits), "%08" PRId64, step);
  return std::string(prefix) + digits;
}

// The step of a name written by step_name(prefix, ·), or nothing for any
// other name ("step_7", "step_00000007.old", "step_-0000001").
std::optional<std::int64_t> parse_step_name(std::string_view prefix, const std::string& name) {
  if (name.size() < prefix.size() + 8 || name.compare(0, prefix.size(), prefix) != 0) return {};
  std::int64_t step = 0;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return {};
    if (__builtin_mul_overflow(step, 10, &step) || __builtin_add_overflow(step, name[i] - '0', &step)) {
      return {};
    }
  }
  if (step_name(prefix, step) != name) return {};  // "step_000000123" is not canonical
  return step;
}

// A path inside a checkpoint: relative, normalised, no "..", and not the
// manifest itself. Empty string when acceptable, else the broken rule.
std::string relative_path_problem(const std::string& relative_path) {
  const fs::path path(relative_path);
  if (relative_path.empty()) return "is empty";
  if (path.is_absolute() || path.has_root_name() || path.has_root_directory()) return "is absolute";
  for (const fs::path& part : path) {
    if (part == "..") return "contains '..'";
    if (part == "." || part.empty()) return "is not normalised (has '.', '//' or a trailing '/')";
  }
  // As strings: path equality compares element-wise, so "a//b" == "a/b".
  if (path.lexically_normal().generic_string() != relative_path) return "is not normalised";
  if (path == CheckpointStore::kManifestName) return "is the manifest's own name";
  return {};
}

void check_caller_relative_path(const std::string& relative_path) {
  const std::string problem = relative_path_problem(relative_path);
  if (!problem.empty()) {
    throw InternalError("checkpoint file path '" + relative_path + "' " + problem +
                        "; it must be relative to the checkpoint directory, e.g. rank_0/layer_1.wi0.npy");
  }
}

void check_step(std::int64_t step) {
  if (step < 0) throw InternalError("checkpoint step " + std::to_string(step) + " is negative");
}

// Makes a directory's entries (files created or renamed in it) durable.
void fsync_directory(const fs::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_file_error(directory, "cannot open the directory to flush it: " + errno_text());
  const int result = ::fsync(fd);
  const int saved_errno = errno;
  ::close(fd);
  // EINVAL: the file system cannot sync directories (some network file
  // systems); their metadata is then as durable as that system makes it.
  if (result != 0 && saved_errno != EINVAL) {
    errno = saved_errno;
    throw_file_error(directory, "cannot flush the directory to disk: " + errno_text());
  }
}

struct FileDigest {
  std::uint64_t num_bytes = 0;
  std::uint32_t crc32 = 0;
};

// Size and zlib CRC-32 of a whole file, read in 1 MiB blocks; optionally
// fsyncs it (commit() makes sure files written by any rank, by any means,
// are on disk before the manifest vouches for them). Returns nothing when the
// file does not exist.
std::optional<FileDigest> digest_file(const fs::path& path, bool flush_to_disk) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return {};
    throw_file_error(path, "cannot open: " + errno_text());
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  std::vector<unsigned char> block(1 << 20);
  FileDigest digest;
  uLong crc = ::crc32(0L, Z_NULL, 0);
  while (true) {
    const ssize_t num_read = ::read(fd, block.data(), block.size());
    if (num_read < 0) {
      if (errno == EINTR) continue;
      throw_file_error(path, "read failed: " + errno_text());
    }
    if (num_read == 0) break;
    crc = ::crc32(crc, block.data(), static_cast<uInt>(num_read));
    digest.num_bytes += static_cast<std::uint64_t>(num_read);
  }
  if (flush_to_disk && ::fsync(fd) != 0 && errno != EINVAL) {
    throw_file_error(path, "cannot flush to disk: " + errno_text());
  }
  digest.crc32 = static_cast<std::uint32_t>(crc);
  return digest;
}

// rename(2) that fails instead of replacing an (empty) directory already at
// `target`: two committers of one step must not both succeed.
bool rename_without_replacing(const fs::path& source, const fs::path& target) {
  if (::renameat2(AT_FDCWD, source.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) == 0) return true;
  if (errno != EINVAL && errno != ENOSYS) return false;
  // The file system does not support RENAME_NOREPLACE: check, then rename.
  std::error_code error;
  if (fs::exists(fs::symlink_status(target, error))) {
    errno = EEXIST;
    return false;
  }
  return ::rename(source.c_str(), target.c_str()) == 0;
}

[[noreturn]] void refuse_overwrite(const fs::path& step_dir) {
  throw_file_error(step_dir, "refusing to overwrite checkpoint " + step_dir.string() +
                                 ": it already exists (remove it first to save this step again)");
}

// One entry of the manifest's "files".
struct ManifestFile {
  std::string path;
  std::uint64_t num_bytes = 0;
  std::uint32_t crc32 = 0;
};

struct Manifest {
  nlohmann::json json;
  std::vector<ManifestFile> files;
};

void check_against_manifest(const fs::path& step_dir, const fs::path& manifest_path, const ManifestFile& file) {
  const fs::path full = step_dir / file.path;
  std::error_code error;
  const auto status = fs::status(full, error);
  if (!fs::exists(status)) {
    throw_file_error(full, "listed in " + manifest_path.string() + " but missing; the checkpoint is incomplete");
  }
  if (!fs::is_regular_file(status)) throw_file_error(full, "not a regular file; the checkpoint is corrupt");
  const std::optional<FileDigest> digest = digest_file(full, false);
  if (!digest) throw_file_error(full, "vanished while being verified");
  if (digest->num_bytes != file.num_bytes) {
    throw_file_error(full, std::to_string(digest->num_bytes) + " bytes, the manifest records " +
                               std::to_string(file.num_bytes) +
                               "; the checkpoint is corrupt (truncated or overwritten)");
  }
  if (digest->crc32 != file.crc32) {
    throw_file_error(full, "CRC-32 " + hex32(digest->crc32) + " does not match the manifest's " + hex32(file.crc32) +
                               "; the checkpoint is corrupt");
  }
}

// Parses and checks the manifest's structure; does not look at the files.
Manifest load_manifest(const fs::path& step_dir, std::int64_t step) {
  const fs::path path = step_dir / CheckpointStore::kManifestName;
  std::error_code error;
  if (!fs::is_regular_file(fs::status(path, error))) {
    throw_file_error(path, "no such file (no committed checkpoint of step " + std::to_string(step) + ")");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_file_error(path, "cannot open: " + errno_text());
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw_file_error(path, "read failed");

  Manifest manifest;
  try {
    manifest.json = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw_file_error(path, std::string("not valid JSON (") + e.what() + "); the checkpoint is corrupt");
  }
  const nlohmann::json& json = manifest.json;
  const auto bad = [&](const std::string& rule) { throw_file_error(path, rule + "; the checkpoint is corrupt"); };
  if (!json.is_object()) bad("not a JSON object");
  if (!json.contains("format") || json["format"] != CheckpointStore::kFormat) {
    bad("'format' is " + (json.contains("format") ? json["format"].dump() : std::string("missing")) + ", expected \"" +
        CheckpointStore::kFormat + "\"");
  }
  if (!json.contains("version") || !json["version"].is_number_integer()) bad("'version' is missing or not an integer");
  if (json["version"].get<std::int64_t>() != CheckpointStore::kVersion) {
    throw_file_error(path, "checkpoint format version " + json["version"].dump() + "; this epmoe reads version " +
                               std::to_string(CheckpointStore::kVersion));
  }
  if (!json.contains("step") || !json["step"].is_number_integer()) bad("'step' is missing or not an integer");
  if (json["step"].get<std::int64_t>() != step) {
    bad("records step " + json["step"].dump() + " but lies in " + step_dir.filename().string());
  }
  if (!json.contains("metadata") || !json["metadata"].is_object()) bad("'metadata' is missing or not an object");
  if (!json.contains("files") || !json["files"].is_array()) bad("'files' is missing or not an array");

  std::set<std::string> seen;
  for (const nlohmann::json& entry : json["files"]) {
    const bool well_formed = entry.is_object() && entry.contains("path") && entry["path"].is_string() &&
                             entry.contains("bytes") && entry["bytes"].is_number_unsigned() &&
                             entry.contains("crc32") && entry["crc32"].is_number_unsigned() &&
                             entry["crc32"].get<std::uint64_t>() <= 0xffffffffu;
    if (!well_formed) bad("malformed 'files' entry " + entry.dump() + " (needs path, bytes, crc32)");
    ManifestFile file{entry["path"].get<std::string>(), entry["bytes"].get<std::uint64_t>(),
                      static_cast<std::uint32_t>(entry["crc32"].get<std::uint64_t>())};
    // A manifest must not send a reader outside its directory.
    const std::string problem = relative_path_problem(file.path);
    if (!problem.empty()) bad("file path '" + file.path + "' " + problem);
    if (!seen.insert(file.path).second) bad("lists '" + file.path + "' twice");
    manifest.files.push_back(std::move(file));
  }
  return manifest;
}

DType dtype_of_npy(const fs::path& path) {
  const std::string descr = read_npy_header(path).descr;
  const std::string_view code = descr.size() > 1 && (descr[0] == '<' || descr[0] == '=' || descr[0] == '|')
                                    ? std::string_view(descr).substr(1)
                                    : std::string_view();
  if (code == "i4") return DType::i32;
  if (code == "i8") return DType::i64;
  // f4, and anything else: read_npy then names the file's dtype and the fix.
  return DType::f32;
}

}  // namespace

CheckpointStore::CheckpointStore(std::filesystem::path root) : root_(std::move(root)) {}

std::filesystem::path CheckpointStore::step_dir(std::int64_t step) const {
  check_step(step);
  return root_ / step_name(kStepPrefix, step);
}

std::filesystem::path CheckpointStore::staging_dir(std::int64_t step) const {
  check_step(step);
  return root_ / step_name(kStagingPrefix, step);
}

std::filesystem::path CheckpointStore::begin_staging(std::int64_t step) const {
  const fs::path final_dir = step_dir(step);
  const fs::path staging = staging_dir(step);
  std::error_code error;
  fs::create_directories(root_, error);
  if (error) throw_file_error(root_, "cannot create the checkpoint directory: " + error.message());
  if (fs::exists(fs::symlink_status(final_dir, error))) refuse_overwrite(final_dir);
  fs::remove_all(staging, error);  // left by a run killed while writing this step
  if (error) throw_file_error(staging, "cannot remove the stale staging directory: " + error.message());
  fs::create_directory(staging, error);
  if (error) throw_file_error(staging, "cannot create the staging directory: " + error.message());
  return staging;
}

void CheckpointStore::write_tensor(std::int64_t step, const std::string& relative_path, const Tensor& tensor) const {
  check_caller_relative_path(relative_path);
  const fs::path staging = staging_dir(step);
  std::error_code error;
  if (!fs::is_directory(fs::status(staging, error))) {
    throw_file_error(staging, "no staging directory for checkpoint step " + std::to_string(step) +
                                  " (begin_staging must run, and finish, before the ranks write)");
  }
  const fs::path path = staging / relative_path;
  fs::create_directories(path.parent_path(), error);
  // Another rank may create the same sub-directory at the same moment.
  if (error && !fs::is_directory(fs::status(path.parent_path(), error))) {
    throw_file_error(path.parent_path(), "cannot create directory: " + error.message());
  }
  write_npy(path, tensor);
}

void CheckpointStore::commit(std::int64_t step, const std::vector<std::string>& relative_paths,
                             const nlohmann::json& metadata) const {
  if (!metadata.is_null() && !metadata.is_object()) {
    throw InternalError("checkpoint metadata must be a JSON object, not " + std::string(metadata.type_name()));
  }
  const fs::path final_dir = step_dir(step);
  const fs::path staging = staging_dir(step);
  std::error_code error;
  if (fs::exists(fs::symlink_status(final_dir, error))) refuse_overwrite(final_dir);
  if (!fs::is_directory(fs::status(staging, error))) {
    throw_file_error(staging, "no staging directory for checkpoint step " + std::to_string(step) +
                                  " (begin_staging was not called, or the directory was removed)");
  }

  nlohmann::json files = nlohmann::json::array();
  std::set<std::string> seen;
  for (const std::string& relative_path : relative_paths) {
    check_caller_relative_path(relative_path);
    if (!seen.insert(relative_path).second) {
      throw InternalError("checkpoint file '" + relative_path + "' is listed twice");
    }
    const fs::path path = staging / relative_path;
    const std::optional<FileDigest> digest = digest_file(path, true);
    if (!digest) {
      throw_file_error(path, "listed for checkpoint step " + std::to_string(step) +
                                 " but missing from the staging directory (did every rank write its files?)");
    }
    files.push_back({{"path", relative_path}, {"bytes", digest->num_bytes}, {"crc32", digest->crc32}});
  }

  const nlohmann::json manifest = {{"format", kFormat},
                                   {"version", kVersion},
                                   {"step", step},
                                   {"metadata", metadata.is_null() ? nlohmann::json::object() : metadata},
                                   {"files", std::move(files)}};
  const std::string manifest_text = manifest.dump(2) + "\n";
  write_file_atomically(staging / kManifestName, {manifest_text});

  // The files' directory entries must be durable before the rename publishes
  // them; children first, the staging directory (holding the manifest) last.
  std::vector<fs::path> directories;
  for (fs::recursive_directory_iterator it(staging, error), end; !error && it != end; it.increment(error)) {
    if (it->is_directory(error)) directories.push_back(it->path());
  }
  if (error) throw_file_error(staging, "cannot list the staging directory: " + error.message());
  for (const fs::path& directory : directories) fsync_directory(directory);
  fsync_directory(staging);

  if (!rename_without_replacing(staging, final_dir)) {
    if (errno == EEXIST || errno == ENOTEMPTY) refuse_overwrite(final_dir);
    throw_file_error(final_dir,
                     "cannot move the staging directory " + staging.string() + " into place: " + errno_text());
  }
  fsync_directory(root_);
}

namespace {

// Every step_<N> entry of `root` (none when it does not exist), ascending;
// committed: a directory holding a manifest.json.
struct StepEntry {
  std::int64_t step;
  bool committed;
};

std::vector<StepEntry> step_entries(const fs::path& root) {
  std::vector<StepEntry> entries;
  std::error_code error;
  if (!fs::exists(fs::status(root, error))) return entries;
  fs::directory_iterator it(root, error);
  if (error) throw_file_error(root, "cannot list the checkpoint directory: " + error.message());
  for (const fs::directory_iterator end; it != end; it.increment(error)) {
    const std::optional<std::int64_t> step = parse_step_name(kStepPrefix, it->path().filename().string());
    if (!step) continue;
    std::error_code entry_error;
    const bool committed = it->is_directory(entry_error) &&
                           fs::is_regular_file(fs::status(it->path() / CheckpointStore::kManifestName, entry_error));
    entries.push_back({*step, committed});
  }
  if (error) throw_file_error(root, "cannot list the checkpoint directory: " + error.message());
  std::sort(entries.begin(), entries.end(), [](const StepEntry& a, const StepEntry& b) { return a.step < b.step; });
  return entries;
}

std::vector<std::int64_t> steps_where(const fs::path& root, bool committed) {
  std::vector<std::int64_t> steps;
  for (const StepEntry& entry : step_entries(root)) {
    if (entry.committed == committed) steps.push_back(entry.step);
  }
  return steps;
}

}  // namespace

std::vector<std::int64_t> CheckpointStore::committed_steps() const { return steps_where(root_, true); }

std::optional<std::int64_t> CheckpointStore::latest_step() const {
  const std::vector<std::int64_t> steps = committed_steps();
  if (steps.empty()) return {};
  return steps.back();
}

std::vector<std::int64_t> CheckpointStore::uncommitted_steps() const { return steps_where(root_, false); }

std::vector<std::filesystem::path> CheckpointStore::remove_stale_leftovers() const {
  std::vector<fs::path> stale;
  std::error_code error;
  if (!fs::exists(fs::status(root_, error))) return stale;
  for (fs::directory_iterator it(root_, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (parse_step_name(kStagingPrefix, name) || parse_step_name(kRemovingPrefix, name)) stale.push_back(it->path());
  }
  if (error) throw_file_error(root_, "cannot list the checkpoint directory: " + error.message());
  std::sort(stale.begin(), stale.end());
  for (const fs::path& path : stale) {
    fs::remove_all(path, error);
    if (error) throw_file_error(path, "cannot remove this leftover of a killed run: " + error.message());
  }
  return stale;
}

nlohmann::json CheckpointStore::verify(std::int64_t step) const {
  const fs::path dir = step_dir(step);
  Manifest manifest = load_manifest(dir, step);
  for (const ManifestFile& file : manifest.files) {
    check_against_manifest(dir, dir / kManifestName, file);
  }
  return std::move(manifest.json);
}

nlohmann::json CheckpointStore::manifest(std::int64_t step) const {
  return std::move(load_manifest(step_dir(step), step).json);
}

Tensor CheckpointStore::read_tensor(std::int64_t step, const std::string& relative_path) const {
  check_caller_relative_path(relative_path);
  const fs::path dir = step_dir(step);
  const Manifest manifest = load_manifest(dir, step);
  const auto file = std::find_if(manifest.files.begin(), manifest.files.end(),
                                 [&](const ManifestFile& f) { return f.path == relative_path; });
  const fs::path path = dir / relative_path;
  if (file == manifest.files.end()) throw_file_error(path, "not listed in " + (dir / kManifestName).string());
  check_against_manifest(dir, dir / kManifestName, *file);
  return read_npy(path, dtype_of_npy(path));
}

void CheckpointStore::remove_all_but_latest(int keep) const {
  EPMOE_CHECK_GE(keep, 1);
  std::error_code error;
  if (!fs::exists(fs::status(root_, error))) return;
  // Finish deletions a killed run left half done.
  std::vector<fs::path> leftovers;
  for (fs::directory_iterator it(root_, error), end; !error && it != end; it.increment(error)) {
    if (parse_step_name(kRemovingPrefix, it->path().filename().string())) leftovers.push_back(it->path());
  }
  if (error) throw_file_error(root_, "cannot list the checkpoint directory: " + error.message());

  const std::vector<std::int64_t> steps = committed_steps();
  const std::size_t num_removed = steps.size() > static_cast<std::size_t>(keep) ? steps.size() - keep : 0;
  // Out of the step_* namespace first, in one rename each, so that no reader
  // ever finds a committed-looking checkpoint with files missing.
  for (std::size_t i = 0; i < num_removed; ++i) {
    const fs::path doomed = root_ / step_name(kRemovingPrefix, steps[i]);
    fs::remove_all(doomed, error);
    if (error) throw_file_error(doomed, "cannot remove: " + error.message());
    fs::rename(step_dir(steps[i]), doomed, error);
    if (error) throw_file_error(step_dir(steps[i]), "cannot move aside for removal: " + error.message());
    leftovers.push_back(doomed);
  }
  if (num_removed > 0) fsync_directory(root_);
  for (const fs::path& path : leftovers) {
    fs::remove_all(path, error);
    if (error) throw_file_error(path, "cannot remove: " + error.message());
  }
}

CheckpointDirLock::CheckpointDirLock(const std::filesystem::path& root) {
  std::error_code error;
  fs::create_directories(root, error);
  if (error) throw FileError("checkpoint_dir=" + root.string() + ": cannot be created: " + error.message());
  const fs::path path = root / kLockName;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw_file_error(path, "cannot create the lock file of checkpoint_dir=" + root.string() + ": " + errno_text());
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int saved_errno = errno;
    // The holder writes its pid right after locking; read what is there.
    char text[32] = {};
    const ssize_t num_read = ::pread(fd_, text, sizeof(text) - 1, 0);
    std::string holder = num_read > 0 ? std::string(text, static_cast<std::size_t>(num_read)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (saved_errno == EWOULDBLOCK) {
      throw FileError("checkpoint_dir=" + root.string() + " is in use by another epmoe train (pid " +
                      (holder.empty() ? std::string("unknown") : holder) + ", lock " + path.string() +
                      "); two trainers must not write one checkpoint directory: wait for it to end or "
                      "choose another checkpoint_dir");
    }
    errno = saved_errno;
    throw_file_error(path, "cannot lock: " + errno_text());
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const std::string reason = errno_text();
    ::close(fd_);
    fd_ = -1;
    throw_file_error(path, "cannot write the lock file: " + reason);
  }
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the flock
}

}  // namespace epmoe
