// StagedOutputDir: nothing appears in the output directory before commit(),
// the completion marker arrives last, an old marker is gone before any new
// file lands, and an abandoned staging leaves no trace.
#include "data/staged_output_dir.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/error.h"
#include "data/test_files.h"

namespace epmoe {
namespace {

using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

std::set<std::string> entries(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

TEST(StagedOutputDir, NothingAppearsBeforeCommit) {
  ScratchDir scratch;
  const auto out = scratch / "out";
  {
    StagedOutputDir staged(out);
    write_bytes(staged.staged_path("y.npy"), "new");
    EXPECT_FALSE(std::filesystem::exists(out));
  }  // abandoned: as if the command failed
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_TRUE(entries(scratch.path()).empty()) << "staging directory left behind";
}

TEST(StagedOutputDir, CommitMovesFilesAndMarkerAndRemovesObsoleteOnes) {
  ScratchDir scratch;
  const auto out = scratch / "out";
  std::filesystem::create_directories(out);
  write_bytes(out / "y.npy", "old");
  write_bytes(out / "dx.npy", "old gradient");
  write_bytes(out / "metrics.json", "old");
  write_bytes(out / "notes.txt", "the user's own file");

  StagedOutputDir staged(out.string() + "/");  // a trailing slash names the same directory
  write_bytes(staged.staged_path("y.npy"), "new");
  write_bytes(staged.staged_path("metrics.json"), "new metrics");
  staged.commit({"y.npy"}, "metrics.json", {"dx.npy"});

  EXPECT_EQ(entries(out), (std::set<std::string>{"y.npy", "metrics.json", "notes.txt"}));
  EXPECT_EQ(read_bytes(out / "y.npy"), "new");
  EXPECT_EQ(read_bytes(out / "metrics.json"), "new metrics");
  EXPECT_EQ(entries(scratch.path()), (std::set<std::string>{"out"}));
}

TEST(StagedOutputDir, MissingStagedFileFailsAfterTheOldMarkerIsGone) {
  ScratchDir scratch;
  const auto out = scratch / "out";
  std::filesystem::create_directories(out);
  write_bytes(out / "metrics.json", "old");
  StagedOutputDir staged(out);
  write_bytes(staged.staged_path("metrics.json"), "new");
  EXPECT_THROW(staged.commit({"y.npy"}, "metrics.json"), FileError);
  // The old marker must not vouch for a half-replaced set.
  EXPECT_FALSE(std::filesystem::exists(out / "metrics.json"));
}

TEST(StagedOutputDir, RejectsAFileAsOutputDirectory) {
  ScratchDir scratch;
  write_bytes(scratch / "out", "a file");
  try {
    StagedOutputDir staged(scratch / "out");
    FAIL() << "no FileError";
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find("not a directory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace epmoe
