#include "core/buffer_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>

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

}  // namespace
}  // namespace epmoe
