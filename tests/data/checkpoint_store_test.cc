// CheckpointStore: tensors and metadata survive a round trip; the manifest's
// CRC-32 is the standard one (what python's zlib.crc32 gives); every kind of
// damage (truncation, a flipped byte, a missing file, a bad manifest) is a
// FileError naming the damaged file; a killed write or a refused overwrite
// leaves the earlier checkpoints loadable; pruning keeps the newest.
//
// Topology: one store in a fresh scratch directory per test. A checkpoint
// holds three files as a 2-rank trainer would write them, each rank a thread:
//   replicated/embedding.npy  f32 [3, 4]   (written by rank 0)
//   rank_0/layer_1.wi0.npy    i32 [2, 5]   (rank 0)
//   rank_1/layer_1.wi0.npy    i64 [6]      (rank 1)
// Values depend on the step, so checkpoints of different steps differ.
#include "data/checkpoint_store.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "data/npy.h"
#include "data/test_files.h"

namespace epmoe {
namespace {

namespace fs = std::filesystem;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

const std::vector<std::string> kFiles = {"replicated/embedding.npy", "rank_0/layer_1.wi0.npy",
                                         "rank_1/layer_1.wi0.npy"};

Tensor embedding(std::int64_t step) {
  Tensor t(DType::f32, {3, 4});
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.25f * i - 1.0f + step;
  return t;
}
Tensor rank0_weights(std::int64_t step) {
  Tensor t(DType::i32, {2, 5});
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<std::int32_t>()[i] = static_cast<std::int32_t>(i * 7 - 20 + step);
  return t;
}
Tensor rank1_weights(std::int64_t step) {
  Tensor t(DType::i64, {6});
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<std::int64_t>()[i] = (std::int64_t{1} << 40) + i + step;
  return t;
}

nlohmann::json metadata(std::int64_t step) {
  return {{"loss", 2.5}, {"tokens_seen", step * 1024}, {"config", {{"ranks", 2}}}};
}

// begin_staging by one rank, a barrier (the join), each rank writes its own
// files concurrently, one commit.
void save(const CheckpointStore& store, std::int64_t step) {
  store.begin_staging(step);
  std::thread rank0([&] {
    store.write_tensor(step, kFiles[0], embedding(step));
    store.write_tensor(step, kFiles[1], rank0_weights(step));
  });
  std::thread rank1([&] { store.write_tensor(step, kFiles[2], rank1_weights(step)); });
  rank0.join();
  rank1.join();
  store.commit(step, kFiles, metadata(step));
}

template <typename T>
std::vector<T> values(const Tensor& tensor) {
  const auto span = tensor.span<T>();
  return {span.begin(), span.end()};
}

// Bitwise CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320): the
// reference the manifest's zlib checksums are checked against.
std::uint32_t reference_crc32(const std::string& bytes) {
  std::uint32_t crc = 0xffffffffu;
  for (unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// Runs `action`, which must throw FileError; returns its message.
template <typename Action>
std::string file_error_message(Action action) {
  try {
    action();
  } catch (const FileError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no FileError";
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(CheckpointStore, ReferenceCrcIsTheStandardOne) {
  EXPECT_EQ(reference_crc32("123456789"), 0xcbf43926u);  // the CRC-32 check value
}

TEST(CheckpointStore, RoundTripOfTensorsAndMetadata) {
  ScratchDir scratch;
  const CheckpointStore store(scratch / "ckpt");
  EXPECT_EQ(store.latest_step(), std::nullopt);  // root does not exist yet
  save(store, 120);

  const fs::path dir = scratch / "ckpt" / "step_00000120";
  EXPECT_EQ(store.step_dir(120), dir);
  EXPECT_EQ(testing::directory_entries(scratch / "ckpt"), (std::set<std::string>{"step_00000120"}))
      << "staging left behind";
  EXPECT_EQ(store.committed_steps(), (std::vector<std::int64_t>{120}));
  EXPECT_EQ(store.latest_step(), 120);

  const nlohmann::json manifest = store.verify(120);
  EXPECT_EQ(manifest["format"], "epmoe-checkpoint");
  EXPECT_EQ(manifest["version"], 1);
  EXPECT_EQ(manifest["step"], 120);
  EXPECT_EQ(manifest["metadata"], metadata(120));
  ASSERT_EQ(manifest["files"].size(), kFiles.size());
  for (std::size_t i = 0; i < kFiles.size(); ++i) {
    const nlohmann::json& entry = manifest["files"][i];
    EXPECT_EQ(entry["path"], kFiles[i]);
    const std::string bytes = read_bytes(dir / kFiles[i]);
    EXPECT_EQ(entry["bytes"], bytes.size());
    EXPECT_EQ(entry["crc32"], reference_crc32(bytes)) << kFiles[i];
  }
  // The manifest on disk is what verify() returned.
  EXPECT_EQ(nlohmann::json::parse(read_bytes(dir / "manifest.json")), manifest);

  const Tensor e = store.read_tensor(120, kFiles[0]);
  EXPECT_EQ(e.dtype(), DType::f32);
  EXPECT_EQ(e.shape(), (Shape{3, 4}));
  EXPECT_EQ(values<float>(e), values<float>(embedding(120)));
  const Tensor w0 = store.read_tensor(120, kFiles[1]);
  EXPECT_EQ(w0.dtype(), DType::i32);
  EXPECT_EQ(w0.shape(), (Shape{2, 5}));
  EXPECT_EQ(values<std::int32_t>(w0), values<std::int32_t>(rank0_weights(120)));
  const Tensor w1 = store.read_tensor(120, kFiles[2]);
  EXPECT_EQ(w1.dtype(), DType::i64);
  EXPECT_EQ(values<std::int64_t>(w1), values<std::int64_t>(rank1_weights(120)));
  // Plain .npy files: readable without the store (numpy reads them the same way).
  EXPECT_EQ(values<float>(read_npy(dir / kFiles[0], DType::f32)), values<float>(embedding(120)));
}

TEST(CheckpointStore, StepNamesGrowPastEightDigits) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  EXPECT_EQ(store.step_dir(7).filename(), "step_00000007");
  EXPECT_EQ(store.staging_dir(7).filename(), ".staging_step_00000007");
  save(store, 123456789);
  save(store, 99999999);
  EXPECT_EQ(store.committed_steps(), (std::vector<std::int64_t>{99999999, 123456789}));
  EXPECT_NO_THROW(store.verify(123456789));
}

TEST(CheckpointStore, CommittedStepsIgnoreStagingAndJunk) {
  ScratchDir scratch;
  const fs::path root = scratch / "ckpt";
  const CheckpointStore store(root);
  save(store, 12);
  save(store, 3);
  // A killed write, and things that look like checkpoints but are not.
  store.begin_staging(20);
  store.write_tensor(20, kFiles[0], embedding(20));
  write_bytes(store.staging_dir(20) / "manifest.json", "{}");
  fs::create_directories(root / "step_00000030");  // no manifest
  fs::create_directories(root / "step_7");         // not canonical
  write_bytes(root / "step_7" / "manifest.json", "{}");
  fs::create_directories(root / "step_00000050.old");
  write_bytes(root / "step_00000050.old" / "manifest.json", "{}");
  write_bytes(root / "step_00000040", "a file, not a directory");
  write_bytes(root / "notes.txt", "the user's own file");

  EXPECT_EQ(store.committed_steps(), (std::vector<std::int64_t>{3, 12}));
  EXPECT_EQ(store.latest_step(), 12);
}

TEST(CheckpointStore, TruncatedFileIsReportedByName) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  save(store, 5);
  const fs::path damaged = store.step_dir(5) / kFiles[1];
  const std::string bytes = read_bytes(damaged);
  write_bytes(damaged, bytes.substr(0, bytes.size() - 4));

  const std::string message = file_error_message([&] { store.verify(5); });
  EXPECT_TRUE(contains(message, damaged.string())) << message;
  EXPECT_TRUE(contains(message, std::to_string(bytes.size() - 4) + " bytes")) << message;
  EXPECT_TRUE(contains(message, "corrupt")) << message;
  EXPECT_TRUE(contains(file_error_message([&] { store.read_tensor(5, kFiles[1]); }), damaged.string()));
  // read_tensor checks only the file it reads: an intact neighbour still loads.
  EXPECT_EQ(values<float>(store.read_tensor(5, kFiles[0])), values<float>(embedding(5)));
}

TEST(CheckpointStore, FlippedByteIsReportedAsACrcMismatch) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  save(store, 5);
  const fs::path damaged = store.step_dir(5) / kFiles[2];
  std::string bytes = read_bytes(damaged);
  const std::uint32_t good_crc = reference_crc32(bytes);
  bytes[bytes.size() - 3] ^= 0x10;  // inside the array data: the npy header stays valid
  write_bytes(damaged, bytes);

  const std::string message = file_error_message([&] { store.verify(5); });
  EXPECT_TRUE(contains(message, damaged.string())) << message;
  char expected[64];
  std::snprintf(expected, sizeof(expected), "CRC-32 0x%08x does not match the manifest's 0x%08x",
                reference_crc32(bytes), good_crc);
  EXPECT_TRUE(contains(message, expected)) << message;
  EXPECT_TRUE(contains(file_error_message([&] { store.read_tensor(5, kFiles[2]); }), "CRC-32"));
  // manifest() checks the manifest only: a rank loading other files is not slowed by this one.
  EXPECT_EQ(store.manifest(5)["step"], 5);
}

TEST(CheckpointStore, MissingFileIsReportedByName) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  save(store, 5);
  const fs::path removed = store.step_dir(5) / kFiles[0];
  fs::remove(removed);
  const std::string message = file_error_message([&] { store.verify(5); });
  EXPECT_TRUE(contains(message, removed.string())) << message;
  EXPECT_TRUE(contains(message, "missing")) << message;
  EXPECT_TRUE(contains(file_error_message([&] { store.read_tensor(5, kFiles[0]); }), removed.string()));
}

TEST(CheckpointStore, BadManifestsAreReportedByName) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  save(store, 5);
  const fs::path manifest_path = store.step_dir(5) / "manifest.json";
  const nlohmann::json good = nlohmann::json::parse(read_bytes(manifest_path));

  struct Case {
    std::string name;
    std::string text;
    std::string rule;  // part of the message
  };
  std::vector<Case> cases = {{"garbage", "{\"format\": \"epmoe-checkp", "not valid JSON"},
                             {"empty", "", "not valid JSON"},
                             {"array", "[1, 2]", "not a JSON object"}};
  const auto altered = [&](const std::string& name, auto change, const std::string& rule) {
    nlohmann::json manifest = good;
    change(manifest);
    cases.push_back({name, manifest.dump(), rule});
  };
  altered(
      "format", [](nlohmann::json& m) { m["format"] = "other"; }, "'format'");
  altered(
      "version", [](nlohmann::json& m) { m["version"] = 2; }, "version 2");
  altered(
      "step", [](nlohmann::json& m) { m["step"] = 6; }, "records step 6 but lies in step_00000005");
  altered(
      "metadata", [](nlohmann::json& m) { m["metadata"] = 3; }, "'metadata'");
  altered(
      "files", [](nlohmann::json& m) { m.erase("files"); }, "'files'");
  altered(
      "crc", [](nlohmann::json& m) { m["files"][0]["crc32"] = "0x1"; }, "malformed 'files' entry");
  altered(
      "escape", [](nlohmann::json& m) { m["files"][0]["path"] = "../../etc/passwd"; }, "'..'");
  altered(
      "absolute", [](nlohmann::json& m) { m["files"][0]["path"] = "/etc/passwd"; }, "absolute");
  altered(
      "twice", [](nlohmann::json& m) { m["files"][1] = m["files"][0]; }, "twice");

  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    write_bytes(manifest_path, c.text);
    const std::string message = file_error_message([&] { store.verify(5); });
    EXPECT_TRUE(contains(message, manifest_path.string())) << message;
    EXPECT_TRUE(contains(message, c.rule)) << message;
    EXPECT_THROW(store.read_tensor(5, kFiles[1]), FileError);
    EXPECT_EQ(read_bytes(manifest_path), c.text) << "reading modified the manifest";
  }
  write_bytes(manifest_path, good.dump());
  EXPECT_NO_THROW(store.verify(5)) << "the cases above were rejected for their damage alone";
  // No manifest at all: not a committed checkpoint.
  EXPECT_TRUE(contains(file_error_message([&] { store.verify(6); }), (store.step_dir(6) / "manifest.json").string()));
}

TEST(CheckpointStore, ReadTensorRefusesAFileNotInTheManifest) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  save(store, 5);
  const fs::path stray = store.step_dir(5) / "rank_0" / "extra.npy";
  write_npy(stray, embedding(0));
  const std::string message = file_error_message([&] { store.read_tensor(5, "rank_0/extra.npy"); });
  EXPECT_TRUE(contains(message, stray.string())) << message;
  EXPECT_TRUE(contains(message, "not listed")) << message;
}

TEST(CheckpointStore, CommitRefusesToOverwriteAnExistingStep) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  save(store, 5);
  const std::string manifest_before = read_bytes(store.step_dir(5) / "manifest.json");

  // Caught early, before any rank writes...
  const std::string early = file_error_message([&] { store.begin_staging(5); });
  EXPECT_TRUE(contains(early, "refusing to overwrite checkpoint " + store.step_dir(5).string())) << early;
  // ...and at commit, for a staging directory made some other way.
  fs::create_directories(store.staging_dir(5) / "replicated");
  write_npy(store.staging_dir(5) / kFiles[0], embedding(99));
  const std::string late = file_error_message([&] { store.commit(5, {kFiles[0]}, metadata(99)); });
  EXPECT_TRUE(contains(late, "refusing to overwrite checkpoint " + store.step_dir(5).string())) << late;

  EXPECT_EQ(read_bytes(store.step_dir(5) / "manifest.json"), manifest_before);
  EXPECT_NO_THROW(store.verify(5));
  EXPECT_EQ(values<float>(store.read_tensor(5, kFiles[0])), values<float>(embedding(5)));
}

TEST(CheckpointStore, KilledWriteLeavesThePreviousCheckpointLoadable) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  save(store, 10);
  // The run is killed while writing step 20: files written, no commit.
  store.begin_staging(20);
  store.write_tensor(20, kFiles[0], embedding(20));
  store.write_tensor(20, "rank_0/stale.npy", rank0_weights(20));

  EXPECT_EQ(store.latest_step(), 10);
  EXPECT_NO_THROW(store.verify(10));
  EXPECT_EQ(values<float>(store.read_tensor(10, kFiles[0])), values<float>(embedding(10)));
  EXPECT_THROW(store.verify(20), FileError);

  // The resumed run saves step 20 again: the stale staging directory is
  // replaced, not merged into.
  save(store, 20);
  EXPECT_EQ(store.latest_step(), 20);
  EXPECT_FALSE(fs::exists(store.step_dir(20) / "rank_0" / "stale.npy"));
  EXPECT_EQ(values<std::int64_t>(store.read_tensor(20, kFiles[2])), values<std::int64_t>(rank1_weights(20)));
}

TEST(CheckpointStore, CommitWithAMissingFileFailsAndPublishesNothing) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  store.begin_staging(7);
  store.write_tensor(7, kFiles[0], embedding(7));
  store.write_tensor(7, kFiles[1], rank0_weights(7));  // rank 1 never wrote its file
  const std::string message = file_error_message([&] { store.commit(7, kFiles, metadata(7)); });
  EXPECT_TRUE(contains(message, (store.staging_dir(7) / kFiles[2]).string())) << message;
  EXPECT_FALSE(fs::exists(store.step_dir(7)));
  EXPECT_EQ(store.latest_step(), std::nullopt);
}

TEST(CheckpointStore, WritingNeedsAStagingDirectoryAndAPathInsideIt) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  const std::string message = file_error_message([&] { store.write_tensor(3, kFiles[0], embedding(3)); });
  EXPECT_TRUE(contains(message, store.staging_dir(3).string())) << message;
  store.begin_staging(3);
  for (const std::string bad : {"", "../escape.npy", "rank_0/../../escape.npy", "/tmp/abs.npy", "./x.npy",
                                "rank_0//x.npy", "rank_0/", "manifest.json"}) {
    EXPECT_THROW(store.write_tensor(3, bad, embedding(3)), InternalError) << "'" << bad << "'";
  }
  EXPECT_FALSE(fs::exists(scratch / "escape.npy"));
  EXPECT_THROW(store.commit(3, {"../escape.npy"}, {}), InternalError);
  EXPECT_THROW(store.step_dir(-1), InternalError);
}

TEST(CheckpointStore, NullMetadataIsAnEmptyObject) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  store.begin_staging(1);
  store.commit(1, {}, {});
  EXPECT_EQ(store.verify(1)["metadata"], nlohmann::json::object());
  EXPECT_EQ(store.verify(1)["files"], nlohmann::json::array());
  store.begin_staging(2);
  EXPECT_THROW(store.commit(2, {}, nlohmann::json::array()), InternalError);
}

TEST(CheckpointStore, RemoveAllButLatestKeepsTheNewest) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  for (std::int64_t step : {1, 2, 3, 4, 5}) save(store, step);
  store.begin_staging(6);  // a write in progress is not a checkpoint: left alone
  // A deletion interrupted by a kill, finished by the next call.
  fs::create_directories(scratch / ".removing_step_00000000" / "rank_0");

  store.remove_all_but_latest(2);
  EXPECT_EQ(store.committed_steps(), (std::vector<std::int64_t>{4, 5}));
  EXPECT_EQ(testing::directory_entries(scratch.path()),
            (std::set<std::string>{"step_00000004", "step_00000005", ".staging_step_00000006"}));
  store.remove_all_but_latest(5);  // fewer than 5: nothing to do
  EXPECT_EQ(store.committed_steps(), (std::vector<std::int64_t>{4, 5}));
  store.remove_all_but_latest(1);
  EXPECT_EQ(store.committed_steps(), (std::vector<std::int64_t>{5}));
  EXPECT_NO_THROW(store.verify(5));
  EXPECT_THROW(store.remove_all_but_latest(0), InternalError);
  EXPECT_EQ(store.latest_step(), 5);
}

// flock locks belong to an open file description, so a second lock of the
// same directory is refused within one process as it is across processes.
TEST(CheckpointDirLock, ASecondLockIsRefusedNamingTheDirectoryAndThePid) {
  ScratchDir scratch;
  const fs::path root = scratch.path() / "checkpoints";
  {
    const CheckpointDirLock first(root);
    EXPECT_EQ(read_bytes(root / CheckpointDirLock::kLockName), std::to_string(::getpid()) + "\n");
    try {
      const CheckpointDirLock second(root);
      ADD_FAILURE() << "a second lock was granted";
    } catch (const FileError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("checkpoint_dir=" + root.string() + " is in use"), std::string::npos) << message;
      EXPECT_NE(message.find("pid " + std::to_string(::getpid())), std::string::npos) << message;
    }
  }
  EXPECT_NO_THROW(CheckpointDirLock again(root));  // released with its holder
}

TEST(CheckpointStore, UncommittedStepsAreTheStepDirectoriesWithoutManifest) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  save(store, 3);
  fs::create_directories(store.step_dir(9) / "rank_0");
  fs::create_directories(store.staging_dir(12));
  EXPECT_EQ(store.committed_steps(), std::vector<std::int64_t>{3});
  EXPECT_EQ(store.uncommitted_steps(), std::vector<std::int64_t>{9});
}

TEST(CheckpointStore, RemoveStaleLeftoversRemovesStagingAndHalfRemovedOnly) {
  ScratchDir scratch;
  const CheckpointStore store(scratch.path());
  save(store, 3);
  fs::create_directories(store.staging_dir(4) / "rank_1");
  fs::create_directories(scratch.path() / ".removing_step_00000002");
  write_bytes(scratch.path() / "notes.txt", "kept");
  const std::vector<fs::path> removed = store.remove_stale_leftovers();
  EXPECT_EQ(removed, (std::vector<fs::path>{scratch.path() / ".removing_step_00000002", store.staging_dir(4)}));
  EXPECT_FALSE(fs::exists(store.staging_dir(4)));
  EXPECT_TRUE(fs::exists(scratch.path() / "notes.txt"));
  EXPECT_NO_THROW(store.verify(3));
}

}  // namespace
}  // namespace epmoe
