#include "core/buffer_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/tensor.h"

namespace epmoe {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCacheEnabled = false;
#else
constexpr bool kCacheEnabled = true;
#endif

TEST(BufferCache, LargeBlocksAreReusedOnTheSameThread) {
  if (!kCacheEnabled) GTEST_SKIP() << "sanitizer builds bypass the cache by design";
  std::thread([] {  // a fresh thread: a fresh cache
    const std::size_t bytes = std::size_t{3} << 20;
    void* first = acquire_buffer(bytes);
    std::memset(first, 1, bytes);
    release_buffer(first, bytes);
    EXPECT_EQ(buffer_cache_stats().misses, 1);
    // A slightly different size in the same class gets the same block back.
    void* second = acquire_buffer(bytes - 1000);
    EXPECT_EQ(second, first);
    EXPECT_EQ(buffer_cache_stats().hits, 1);
    release_buffer(second, bytes - 1000);
    EXPECT_GT(buffer_cache_stats().cached_bytes, 0);
    clear_buffer_cache();
    EXPECT_EQ(buffer_cache_stats().cached_bytes, 0);
  })
      .join();
}

TEST(BufferCache, SizeClassesWasteAtMostAnEighth) {
  for (std::size_t bytes : {std::size_t{300000}, std::size_t{1} << 20, (std::size_t{5} << 20) + 7}) {
    void* block = acquire_buffer(bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(block) % 64, 0u);
    std::memset(block, 0, bytes);  // the whole request is writable (ASan checks it)
    release_buffer(block, bytes);
  }
}

TEST(BufferCache, TensorsFreedOnAnotherThreadAreSafe) {
  Tensor t(DType::f32, {1 << 20});
  std::thread([tensor = std::move(t)]() mutable { tensor = Tensor(); }).join();
  SUCCEED();
}

// The allocation counts see every buffer, cached or fresh, on every thread,
// with its requested size; a view of caller memory is no buffer.
TEST(BufferCache, AllocationCountsSeeEveryBufferOnEveryThread) {
  reset_buffer_allocation_counts();
  {
    const Tensor small(DType::f32, {10});                     // 40 bytes: below the cached sizes
    const Tensor large(DType::f32, {std::int64_t{1} << 16});  // 256 KiB
    std::thread([] { const Tensor other(DType::i32, {100}); }).join();
    std::vector<float> caller(1 << 16);
    const TensorView view(caller.data(), DType::f32, {1 << 16});
    EXPECT_EQ(view.size_bytes(), large.size_bytes());
    const Tensor empty(DType::f32, {0, 3});  // no bytes: no buffer
  }
  BufferAllocationCounts counts = buffer_allocation_counts();
  EXPECT_EQ(counts.buffers, 3);
  EXPECT_EQ(counts.bytes, 40 + (std::int64_t{1} << 18) + 400);
  EXPECT_EQ(counts.largest_bytes, std::int64_t{1} << 18);
  { const Tensor again(DType::f32, {std::int64_t{1} << 16}); }  // from the cache now: counted all the same
  EXPECT_EQ(buffer_allocation_counts().buffers, 4);
  reset_buffer_allocation_counts();
  counts = buffer_allocation_counts();
  EXPECT_EQ(counts.buffers, 0);
  EXPECT_EQ(counts.bytes, 0);
  EXPECT_EQ(counts.largest_bytes, 0);
}

}  // namespace
}  // namespace epmoe
