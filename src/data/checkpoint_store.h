// CheckpointStore: the file layer of training checkpoints. The trainer
// decides which tensors go in; this class owns the layout, the atomicity, the
// checksums and the verification.
//
//   <root>/step_00000120/manifest.json
//   <root>/step_00000120/rank_0/layer_1.wi0.npy, replicated/embedding.npy, ...
//
// Every tensor is an .npy file (data/npy.h), so numpy reads a checkpoint
// without epmoe. manifest.json holds
//   {"format": "epmoe-checkpoint", "version": 1, "step": 120,
//    "metadata": {...the trainer's...},
//    "files": [{"path": "rank_0/layer_1.wi0.npy", "bytes": 4224, "crc32": 305419896}, ...]}
// with crc32 as zlib.crc32 computes it (python: zlib.crc32(open(f, "rb").read())).
//
// Writing is staged. begin_staging() (one rank) makes a fresh
// <root>/.staging_step_00000120/; every rank — a thread or an MPI process on
// a shared file system — writes its own files there with write_tensor();
// then one caller commit()s: it checksums every listed file, writes the
// manifest, fsyncs, and renames the staging directory to step_00000120 in one
// atomic rename. A run killed at any moment therefore leaves every earlier
// step_* directory untouched and loadable and no step_* directory that is
// half written; a stale staging directory is ignored by readers and removed
// by the next begin_staging() of its step, or at the start of a run by
// remove_stale_leftovers() (under the CheckpointDirLock below).
//
// Errors with files are FileError naming the file's full path and the rule
// ("…/rank_1/layer_0.wi0.npy: CRC-32 0x1234abcd does not match the
// manifest's 0x9e3779b9; the checkpoint is corrupt"). Misuse by the caller
// (a negative step, an absolute or ".." relative path) is InternalError.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace epmoe {

class CheckpointStore {
 public:
  static constexpr const char* kFormat = "epmoe-checkpoint";
  static constexpr int kVersion = 1;
  static constexpr const char* kManifestName = "manifest.json";

  // Touches nothing on disk until begin_staging().
  explicit CheckpointStore(std::filesystem::path root);

  const std::filesystem::path& root() const { return root_; }
  // <root>/step_<8-digit step> (more digits past 99,999,999) and
  // <root>/.staging_step_<8-digit step>.
  std::filesystem::path step_dir(std::int64_t step) const;
  std::filesystem::path staging_dir(std::int64_t step) const;

  // Creates the root if needed, removes a stale staging directory of `step`
  // and creates it fresh; returns it. Called by one rank before the others
  // write (the trainer puts a barrier after it). FileError naming the path
  // on failure, or "refusing to overwrite checkpoint …" when step_<N> exists
  // (caught here, before any bytes are written, as well as in commit()).
  std::filesystem::path begin_staging(std::int64_t step) const;

  // Writes `tensor` (f32, i32 or i64) to `relative_path` in the staging
  // directory of `step`, atomically (write_npy), creating sub-directories.
  // Safe to call concurrently for different paths. `relative_path` must be
  // relative and normalised ("rank_0/layer_1.wi0.npy": no "..", ".", "//").
  // FileError when begin_staging(step) has not run.
  void write_tensor(std::int64_t step, const std::string& relative_path, const Tensor& tensor) const;

  // Turns the staging directory of `step` into step_<N>: reads every listed
  // file back for its size and CRC-32, writes manifest.json (atomically),
  // fsyncs the files and directories, renames the staging directory to
  // step_<N> and fsyncs the root. `metadata` must be a JSON object (null
  // counts as {}). Files in the staging directory that are not listed are
  // carried along but not verified. FileError when step_<N> already exists
  // ("refusing to overwrite checkpoint …") or a listed file is missing.
  void commit(std::int64_t step, const std::vector<std::string>& relative_paths, const nlohmann::json& metadata) const;

  // Steps with a directory step_<N> holding a manifest.json, ascending.
  // Staging directories and unrelated entries are ignored; a missing root
  // gives an empty list. Does not verify the checkpoints.
  std::vector<std::int64_t> committed_steps() const;
  std::optional<std::int64_t> latest_step() const;
  // Directories named step_<N> that hold no manifest.json, ascending. commit()
  // never leaves one (the manifest is inside the directory before the rename)
  // and pruning renames a checkpoint away before deleting it, so one is a
  // partial copy or a damaged checkpoint; the trainer refuses to start over
  // one newer than its resume point instead of failing at that step later.
  std::vector<std::int64_t> uncommitted_steps() const;

  // Leftovers of killed runs: staging directories (.staging_step_*) and
  // checkpoints half removed by pruning (.removing_step_*). Call only while
  // holding the CheckpointDirLock: then no live trainer owns them. Returns
  // the paths removed (FileError naming one that cannot be removed).
  std::vector<std::filesystem::path> remove_stale_leftovers() const;

  // Checks and returns the manifest of `step`: valid JSON, format, version,
  // step, and every listed file present with the recorded size and CRC-32.
  // FileError naming the offending file (the manifest or a data file) and
  // the rule. Reads only; never modifies anything.
  nlohmann::json verify(std::int64_t step) const;
  // The manifest of `step` with the same checks of the manifest itself, but
  // without reading the data files (read_tensor checks each as it reads it):
  // what a rank that loads only its own shard needs.
  nlohmann::json manifest(std::int64_t step) const;

  // Checks that one file's size and CRC-32 match the manifest, then reads it
  // with read_npy in the dtype its header declares (f32, i32 or i64).
  // FileError naming the file when it is not listed, missing or corrupt.
  Tensor read_tensor(std::int64_t step, const std::string& relative_path) const;

  // Deletes the committed checkpoints older than the newest `keep` (keep >=
  // 1, so the newest is never deleted). Each one is first renamed out of the
  // step_* namespace, so a run killed mid-deletion never leaves a step_*
  // directory that looks committed but lacks files; leftovers of such a kill
  // are removed by the next call.
  void remove_all_but_latest(int keep) const;

 private:
  std::filesystem::path root_;
};

// An exclusive lock of a checkpoint directory for one trainer: flock(2) on
// <root>/.epmoe_train.lock, which then holds the owner's pid as text. The
// kernel drops a flock when its process dies (SIGKILL included), so a stale
// lock file never blocks a later run. The file itself stays (removing it
// would race with a third trainer opening it). Not re-entrant within a
// process: take it once per run.
class CheckpointDirLock {
 public:
  static constexpr const char* kLockName = ".epmoe_train.lock";

  // Creates `root` if needed. FileError naming the directory, the lock file
  // and the holder's pid when another process holds it (nothing is written
  // then), or naming the path and the reason when it cannot be created.
  explicit CheckpointDirLock(const std::filesystem::path& root);
  ~CheckpointDirLock();  // releases the lock
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace epmoe
