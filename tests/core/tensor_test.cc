#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "core/memory_ledger.h"

namespace epmoe {
namespace {

TEST(Tensor, AlignedAndSized) {
  for (std::int64_t n : {1, 3, 17, 1000, 600000}) {
    Tensor t(DType::bf16, {n, 3});
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw()) % 64, 0u) << n;
    EXPECT_EQ(t.numel(), n * 3);
    EXPECT_EQ(t.size_bytes(), n * 3 * 2);
  }
}

TEST(Tensor, EmptyShapeHasNoData) {
  Tensor t(DType::f32, {0, 5});
  EXPECT_EQ(t.numel(), 0);
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.dim(-1), 5);
}

TEST(Tensor, ZerosAndCloneAndMove) {
  Tensor t = Tensor::zeros(DType::f32, {4, 4});
  for (float v : t.span<float>()) EXPECT_EQ(v, 0.0f);
  t.data<float>()[5] = 2.5f;
  Tensor c = t.clone();
  EXPECT_EQ(c.data<float>()[5], 2.5f);
  Tensor moved = std::move(t);
  EXPECT_EQ(moved.data<float>()[5], 2.5f);
  EXPECT_EQ(t.numel(), 0);  // NOLINT(bugprone-use-after-move): the moved-from state is defined
}

TEST(Tensor, WrongDtypeAccessIsAnInternalError) {
  Tensor t(DType::i32, {2});
  EXPECT_THROW(t.data<float>(), InternalError);
  EXPECT_NO_THROW(t.data<std::int32_t>());
}

TEST(Tensor, ReshapeKeepsCount) {
  Tensor t(DType::f32, {2, 6});
  t.reshape({3, 4});
  EXPECT_EQ(t.dim(0), 3);
  EXPECT_THROW(t.reshape({5, 2}), InternalError);
}

TEST(Tensor, LedgerSeesLifetime) {
  MemoryLedger ledger;
  {
    Tensor a(DType::f32, {10, 10}, &ledger, "saved/x");
    EXPECT_EQ(ledger.live_bytes("saved/x"), 400);
    {
      Tensor b(DType::bf16, {10}, &ledger, "saved/x");
      EXPECT_EQ(ledger.live_bytes("saved/x"), 420);
    }
    Tensor moved = std::move(a);  // moving does not double count
    EXPECT_EQ(ledger.live_bytes("saved/x"), 400);
  }
  EXPECT_EQ(ledger.live_bytes("saved/x"), 0);
  EXPECT_EQ(ledger.peak_bytes("saved/x"), 420);
  EXPECT_EQ(ledger.total_peak_bytes(), 420);
}

}  // namespace
}  // namespace epmoe

#include <omp.h>

#include <atomic>

#include "core/threading.h"

namespace epmoe {
namespace {

TEST(ParallelFor, CoversEveryIndexEvenInsideAParallelRegion) {
  set_compute_threads(2);
  for (bool nested : {false, true}) {
    std::vector<std::atomic<int>> hits(1000);
    auto run = [&] {
      parallel_for(1000, 1, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) hits[i] += 1;
      });
    };
    if (nested) {
#pragma omp parallel num_threads(1)
      run();
    } else {
      run();
    }
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << (nested ? " nested" : "");
  }
}

}  // namespace
}  // namespace epmoe
