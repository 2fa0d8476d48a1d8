#include "core/memory_ledger.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/error.h"

namespace epmoe {
namespace {

TEST(MemoryLedger, PeaksPerNameAndTotal) {
  MemoryLedger ledger;
  ledger.on_allocate("a", 100);
  ledger.on_allocate("b", 50);
  ledger.on_release("a", 100);
  ledger.on_allocate("b", 70);
  EXPECT_EQ(ledger.peak_bytes("a"), 100);
  EXPECT_EQ(ledger.peak_bytes("b"), 120);
  EXPECT_EQ(ledger.total_peak_bytes(), 150);  // a+b at 150, later b alone at 120
  EXPECT_EQ(ledger.total_live_bytes(), 120);
  ledger.reset_peaks();
  EXPECT_EQ(ledger.peak_bytes("b"), 120);
  EXPECT_EQ(ledger.peak_bytes("a"), 0);
  EXPECT_EQ(ledger.snapshot().by_name.at("b").num_allocations, 2);
}

TEST(MemoryLedger, OverReleaseIsABug) {
  MemoryLedger ledger;
  ledger.on_allocate("a", 10);
  EXPECT_THROW(ledger.on_release("a", 11), InternalError);
  EXPECT_THROW(ledger.on_release("never", 1), InternalError);
}

TEST(MemoryLedger, ConcurrentUpdatesBalance) {
  MemoryLedger ledger;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&ledger] {
      for (int i = 0; i < 1000; ++i) {
        ledger.on_allocate("x", 8);
        ledger.on_release("x", 8);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ledger.live_bytes("x"), 0);
  EXPECT_LE(ledger.peak_bytes("x"), 32);
  EXPECT_GE(ledger.peak_bytes("x"), 8);
}

// Move assignment onto a live charge releases the old bytes, takes over the
// new ones, and keeps both names intact. Names longer than the 15 characters
// of libstdc++'s small-string buffer live on the heap: the old operator=
// destroyed *this (its name included) and then assigned into the dead
// string, a use-after-free that AddressSanitizer reports in this test.
TEST(LedgerCharge, MoveAssignmentKeepsLongNames) {
  MemoryLedger ledger;
  const std::string old_name = "saved/x_sorted/a_name_longer_than_sso";
  const std::string new_name = "saved/mlpwi_0/another_long_heap_name";
  LedgerCharge charge(&ledger, old_name, 100);
  LedgerCharge other(&ledger, new_name, 30);
  charge = std::move(other);
  EXPECT_EQ(ledger.live_bytes(old_name), 0);
  EXPECT_EQ(ledger.live_bytes(new_name), 30);
  // Reassigning again releases under the moved-in name: only right if the
  // name survived the first assignment.
  charge = LedgerCharge(&ledger, old_name, 7);
  EXPECT_EQ(ledger.live_bytes(new_name), 0);
  EXPECT_EQ(ledger.live_bytes(old_name), 7);
  charge = LedgerCharge();
  EXPECT_EQ(ledger.total_live_bytes(), 0);
}

// A group's peak is the peak of its names' sum at one moment: the saved
// activations the backward holds at once, not the sum of each name's peak;
// other groups (buffers) do not enter it.
TEST(MemoryLedger, GroupPeakIsThePeakOfTheSum) {
  MemoryLedger ledger;
  ledger.on_allocate("saved/a", 100);
  ledger.on_release("saved/a", 100);
  ledger.on_allocate("saved/b", 60);
  ledger.on_allocate("buffer/dispatch", 1000);
  EXPECT_EQ(ledger.group_peak_bytes("saved"), 100);  // a's 100, then b's 60: never 160
  EXPECT_EQ(ledger.group_live_bytes("saved"), 60);
  EXPECT_EQ(ledger.group_peak_bytes("buffer"), 1000);
  EXPECT_EQ(ledger.total_peak_bytes(), 1060);
  EXPECT_EQ(ledger.group_peak_bytes("none"), 0);
  ledger.reset_peaks();
  EXPECT_EQ(ledger.group_peak_bytes("saved"), 60);
  EXPECT_EQ(ledger.snapshot().by_group.at("saved").live_bytes, 60);
}

// Resizing a charge moves the ledger by the difference only: a growing
// buffer never shows its old and new size at once in a peak.
TEST(LedgerCharge, ResizeChargesTheDifference) {
  MemoryLedger ledger;
  LedgerCharge charge(&ledger, "buffer/dispatch", 100);
  charge.resize(250);
  EXPECT_EQ(ledger.live_bytes("buffer/dispatch"), 250);
  EXPECT_EQ(ledger.peak_bytes("buffer/dispatch"), 250);  // not 350
  charge.resize(40);
  EXPECT_EQ(ledger.live_bytes("buffer/dispatch"), 40);
  EXPECT_EQ(charge.bytes(), 40);
  charge = LedgerCharge();
  EXPECT_EQ(ledger.total_live_bytes(), 0);
  LedgerCharge detached;  // no ledger: resize only records the size
  detached.resize(8);
  EXPECT_EQ(detached.bytes(), 8);
}

}  // namespace
}  // namespace epmoe
