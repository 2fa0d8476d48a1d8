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

}  // namespace
}  // namespace epmoe
