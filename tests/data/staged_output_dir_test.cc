// StagedOutputDir: nothing appears in the output directory before commit(),
// the completion marker arrives last, an old marker is gone before any new
// file lands, and an abandoned staging leaves no trace. Two writers of one
// directory (two instances, or two processes racing) never leave a mixture:
// the second is refused naming the first's pid. Staging directories of dead
// processes are cleaned up; unusable paths are refused before any work.
#include "data/staged_output_dir.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <thread>

#include "core/error.h"
#include "data/test_files.h"

namespace epmoe {
namespace {

using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

TEST(StagedOutputDir, NothingAppearsBeforeCommit) {
  ScratchDir scratch;
  const auto out = scratch / "out";
  {
    StagedOutputDir staged(out);
    write_bytes(staged.staged_path("y.npy"), "new");
    EXPECT_FALSE(std::filesystem::exists(out));
  }  // abandoned: as if the command failed
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_TRUE(testing::directory_entries(scratch.path()).empty()) << "staging directory left behind";
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

  EXPECT_EQ(testing::directory_entries(out), (std::set<std::string>{"y.npy", "metrics.json", "notes.txt"}));
  EXPECT_EQ(read_bytes(out / "y.npy"), "new");
  EXPECT_EQ(read_bytes(out / "metrics.json"), "new metrics");
  EXPECT_EQ(testing::directory_entries(scratch.path()), (std::set<std::string>{"out"}));
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

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const FileError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "no FileError";
  return {};
}

TEST(StagedOutputDir, SecondWriterIsRefusedNamingTheHoldersPid) {
  ScratchDir scratch;
  const auto out = scratch / "out";
  StagedOutputDir first(out);
  const std::string message = error_of([&] { StagedOutputDir second(out); });
  EXPECT_NE(message.find("another epmoe process (pid " + std::to_string(::getpid()) + ")"), std::string::npos)
      << message;
  EXPECT_NE(message.find(out.string()), std::string::npos) << message;
  // The refused writer removed nothing of the first one's.
  write_bytes(first.staged_path("y.npy"), "first");
  first.commit({"y.npy"}, "");
  EXPECT_EQ(read_bytes(out / "y.npy"), "first");
}

TEST(StagedOutputDir, LockIsReleasedAndItsFileRemovedAtDestruction) {
  ScratchDir scratch;
  const auto out = scratch / "out";
  { StagedOutputDir first(out); }
  EXPECT_TRUE(testing::directory_entries(scratch.path()).empty()) << "lock file or staging directory left behind";
  StagedOutputDir second(out);  // not refused
  write_bytes(second.staged_path("y.npy"), "second");
  second.commit({"y.npy"}, "");
}

// Two processes commit the same set of files into one directory, started
// together, many times. Each file holds the writer's name; after every round
// every file (marker included) must name the same writer. Without the lock
// the renames interleave and the directory holds a mixture with a marker.
TEST(StagedOutputDir, ConcurrentWritersLeaveOneWritersSet) {
  ScratchDir scratch;
  const auto out = scratch / "out";
  constexpr int kRounds = 40, kFiles = 32;
  int refused_total = 0;
  for (int round = 0; round < kRounds; ++round) {
    const auto start = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    std::vector<pid_t> writers;
    for (const std::string name : {"A", "B"}) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        std::this_thread::sleep_until(start);
        int status = 0;
        try {
          StagedOutputDir staged(out);
          std::vector<std::string> files;
          for (int f = 0; f < kFiles; ++f) {
            files.push_back("f" + std::to_string(f));
            write_bytes(staged.staged_path(files.back()), name);
          }
          write_bytes(staged.staged_path("marker"), name);
          staged.commit(files, "marker");
        } catch (const FileError& e) {
          status = std::string(e.what()).find("another epmoe process") != std::string::npos ? 3 : 4;
        }
        ::_exit(status);
      }
      writers.push_back(pid);
    }
    for (const pid_t pid : writers) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      ASSERT_TRUE(WIFEXITED(status));
      ASSERT_TRUE(WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 3) << "writer failed otherwise";
      refused_total += WEXITSTATUS(status) == 3;
    }
    if (!std::filesystem::exists(out / "marker")) continue;  // possible only if both were refused: never
    const std::string winner = read_bytes(out / "marker");
    for (int f = 0; f < kFiles; ++f) {
      ASSERT_EQ(read_bytes(out / ("f" + std::to_string(f))), winner)
          << "round " << round << ": f" << f << " is from another writer than the marker";
    }
  }
  std::printf("concurrent writers: %d of %d rounds had a writer refused\n", refused_total, kRounds);
  EXPECT_EQ(testing::directory_entries(scratch.path()), (std::set<std::string>{"out"}));
}

TEST(StagedOutputDir, StagingDirectoriesOfDeadProcessesAreRemoved) {
  ScratchDir scratch;
  const auto out = scratch / "out";
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);  // reaped: its pid names no process now
  const auto stale = scratch / (".out.staging-" + std::to_string(dead));
  const auto live = scratch / (".out.staging-" + std::to_string(::getppid()));  // a live process's
  std::filesystem::create_directories(stale);
  write_bytes(stale / "y.npy", "crashed run");
  std::filesystem::create_directories(live);
  {
    StagedOutputDir staged(out);
    EXPECT_FALSE(std::filesystem::exists(stale));
    EXPECT_TRUE(std::filesystem::exists(live));
  }
}

TEST(StagedOutputDir, RefusesUnusablePathsBeforeAnyWork) {
  ScratchDir scratch;
  EXPECT_NE(error_of([] { StagedOutputDir::check_usable(""); }).find("empty"), std::string::npos);
  write_bytes(scratch / "file", "x");
  EXPECT_NE(error_of([&] { StagedOutputDir::check_usable(scratch / "file" / "out"); }).find("not a directory"),
            std::string::npos);
  // /proc accepts no new entries, even from root (for whom access() says yes).
  EXPECT_NE(error_of([] { StagedOutputDir::check_usable("/proc/epmoe-no-such/out"); }).find("cannot create files"),
            std::string::npos);
  EXPECT_NE(error_of([] { StagedOutputDir staged("/proc/epmoe-no-such/out"); }).find("cannot create files"),
            std::string::npos);
  StagedOutputDir::check_usable(scratch / "a" / "b" / "out");  // missing parents are fine: they get created
  EXPECT_EQ(testing::directory_entries(scratch.path()), (std::set<std::string>{"file"}))
      << "the check left something behind";
}

TEST(StagedOutputDir, AnAbandonedRunRemovesTheParentsItCreated) {
  ScratchDir scratch;
  { StagedOutputDir staged(scratch / "a" / "b" / "out"); }
  EXPECT_TRUE(testing::directory_entries(scratch.path()).empty());
}

}  // namespace
}  // namespace epmoe
