#include "core/buffer_cache.h"

#include <sys/mman.h>

#include <atomic>
#include <bit>
#include <cstdlib>
#include <map>
#include <new>
#include <vector>

namespace epmoe {
namespace {

constexpr std::size_t kAlignment = 64;
constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
// From 32 KiB up. malloc reuses smaller blocks through its free lists, but
// blocks of 32-256 KiB come from the top of its heap, which it trims (gives
// back to the OS) once 128 KiB there are free: a step's freed activations
// cross that every step, and the next step faults the pages in again. With
// 256 KiB here a steady R=2 layer step took 380-460 page faults; with 32 KiB
// at most 5 (tests/ep/steady_state_test.cc).
constexpr std::size_t kMinCachedBytes = std::size_t{32} << 10;
// A thread keeps at most this much idle; beyond it blocks go back to the OS.
constexpr std::int64_t kMaxCachedBytesPerThread = std::int64_t{4} << 30;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCacheEnabled = false;
#else
constexpr bool kCacheEnabled = true;
#endif

// Rounds up to a size class: 8 classes per power of two.
std::size_t size_class(std::size_t bytes) {
  if (bytes <= kAlignment) return kAlignment;
  const int top_bit = std::bit_width(bytes - 1) - 1;
  const std::size_t step = top_bit >= 3 ? std::size_t{1} << (top_bit - 3) : 1;
  const std::size_t rounded = (bytes + step - 1) / step * step;
  return (rounded + kAlignment - 1) / kAlignment * kAlignment;
}

void* allocate_block(std::size_t padded) {
  const std::size_t alignment = padded >= kHugePageBytes ? kHugePageBytes : kAlignment;
  const std::size_t size = (padded + alignment - 1) / alignment * alignment;
  void* data = std::aligned_alloc(alignment, size);
  if (data == nullptr) throw std::bad_alloc();
  if (size >= kHugePageBytes) madvise(data, size, MADV_HUGEPAGE);  // advice only
  return data;
}

struct ThreadCache {
  std::map<std::size_t, std::vector<void*>> free_blocks;  // by size class
  BufferCacheStats stats;
  ~ThreadCache() {
    for (auto& [size, blocks] : free_blocks)
      for (void* block : blocks) std::free(block);
  }
};

// Trivially destructible, so it stays readable after the cache below is
// gone (a static Tensor may be freed after this thread's thread_locals).
thread_local bool thread_cache_destroyed = false;

struct ThreadCacheHolder {
  ThreadCache cache;
  ~ThreadCacheHolder() { thread_cache_destroyed = true; }
};

ThreadCache& thread_cache() {
  thread_local ThreadCacheHolder holder;
  return holder.cache;
}

// BufferAllocationCounts, as atomics (process-wide).
std::atomic<std::int64_t> counted_buffers{0}, counted_bytes{0}, counted_largest_bytes{0};

void count_allocation(std::size_t bytes) {
  const auto size = static_cast<std::int64_t>(bytes);
  counted_buffers.fetch_add(1, std::memory_order_relaxed);
  counted_bytes.fetch_add(size, std::memory_order_relaxed);
  std::int64_t largest = counted_largest_bytes.load(std::memory_order_relaxed);
  while (size > largest && !counted_largest_bytes.compare_exchange_weak(largest, size, std::memory_order_relaxed)) {
  }
}

}  // namespace

void* acquire_buffer(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  count_allocation(bytes);
  const std::size_t padded = size_class(bytes);
  if (!kCacheEnabled || padded < kMinCachedBytes || thread_cache_destroyed) return allocate_block(padded);
  ThreadCache& cache = thread_cache();
  auto it = cache.free_blocks.find(padded);
  if (it != cache.free_blocks.end() && !it->second.empty()) {
    void* block = it->second.back();
    it->second.pop_back();
    cache.stats.hits += 1;
    cache.stats.cached_bytes -= static_cast<std::int64_t>(padded);
    return block;
  }
  cache.stats.misses += 1;
  return allocate_block(padded);
}

void release_buffer(void* data, std::size_t bytes) noexcept {
  if (data == nullptr) return;
  const std::size_t padded = size_class(bytes);
  if (!kCacheEnabled || padded < kMinCachedBytes || thread_cache_destroyed) {
    std::free(data);
    return;
  }
  ThreadCache& cache = thread_cache();
  if (cache.stats.cached_bytes + static_cast<std::int64_t>(padded) > kMaxCachedBytesPerThread) {
    std::free(data);
    return;
  }
  try {
    cache.free_blocks[padded].push_back(data);
    cache.stats.cached_bytes += static_cast<std::int64_t>(padded);
  } catch (...) {
    std::free(data);  // no memory for bookkeeping: just give the block back
  }
}

BufferCacheStats buffer_cache_stats() { return thread_cache().stats; }

void clear_buffer_cache() {
  ThreadCache& cache = thread_cache();
  for (auto& [size, blocks] : cache.free_blocks)
    for (void* block : blocks) std::free(block);
  cache.free_blocks.clear();
  cache.stats.cached_bytes = 0;
}

BufferAllocationCounts buffer_allocation_counts() {
  return {counted_buffers.load(std::memory_order_relaxed), counted_bytes.load(std::memory_order_relaxed),
          counted_largest_bytes.load(std::memory_order_relaxed)};
}

void reset_buffer_allocation_counts() {
  counted_buffers.store(0, std::memory_order_relaxed);
  counted_bytes.store(0, std::memory_order_relaxed);
  counted_largest_bytes.store(0, std::memory_order_relaxed);
}

}  // namespace epmoe
