#include "core/buffer_cache.h"

#include <sys/mman.h>

#include <algorithm>
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
// A request may take an idle block of up to this many times its class (its
// pages are resident; a fresh block of the exact class would fault in new
// ones). Measured by replaying a recorded trace of `epmoe train` at ranks=8
// (200 steps, every rank thread's acquires and releases) through this
// policy: exact classes only, 2376 fresh blocks; up to 1.3x, 1362; 2x, 907.
constexpr std::size_t kLargerClassFactor = 2;
// A thread keeps idle at most this many times its peak in-use bytes. On the
// same trace (with 2x above): 1x took 1060 fresh blocks and 338 MB at most
// (in use + idle, all ranks), 2x 907 and 411 MB; the unbounded cache 2376
// and 942 MB, still growing.
constexpr std::int64_t kIdleOverPeakLive = 2;
// And never more than this, whatever its peak.
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

struct IdleBlock {
  void* data;
  std::uint64_t released_at;  // the thread's release count then: the oldest go first
};

struct ThreadCache {
  // By size class, each in release order (a hit takes the newest, an
  // eviction the oldest over all classes).
  std::map<std::size_t, std::vector<IdleBlock>> free_blocks;
  BufferCacheStats stats;
  std::uint64_t num_releases = 0;

  // Frees the block idle longest; false when none is idle.
  bool evict_oldest() {
    std::vector<IdleBlock>* oldest = nullptr;
    std::size_t oldest_class = 0;
    for (auto& [size, blocks] : free_blocks) {
      if (!blocks.empty() && (oldest == nullptr || blocks.front().released_at < oldest->front().released_at)) {
        oldest = &blocks;
        oldest_class = size;
      }
    }
    if (oldest == nullptr) return false;
    std::free(oldest->front().data);
    oldest->erase(oldest->begin());
    stats.cached_bytes -= static_cast<std::int64_t>(oldest_class);
    stats.evicted_bytes += static_cast<std::int64_t>(oldest_class);
    return true;
  }

  ~ThreadCache() {
    for (auto& [size, blocks] : free_blocks)
      for (const IdleBlock& block : blocks) std::free(block.data);
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

BufferBlock acquire_buffer(std::size_t bytes) {
  if (bytes == 0) return {};
  count_allocation(bytes);
  const std::size_t padded = size_class(bytes);
  if (!kCacheEnabled || padded < kMinCachedBytes || thread_cache_destroyed) return {allocate_block(padded), padded};
  ThreadCache& cache = thread_cache();
  BufferBlock block{nullptr, padded};
  // The smallest idle block of this class or a larger one (up to the factor).
  for (auto it = cache.free_blocks.lower_bound(padded);
       it != cache.free_blocks.end() && it->first <= kLargerClassFactor * padded; ++it) {
    if (it->second.empty()) continue;
    block = {it->second.back().data, it->first};
    it->second.pop_back();
    cache.stats.hits += 1;
    cache.stats.cached_bytes -= static_cast<std::int64_t>(block.capacity_bytes);
    break;
  }
  if (block.data == nullptr) {
    block.data = allocate_block(padded);
    cache.stats.misses += 1;
  }
  cache.stats.live_bytes += static_cast<std::int64_t>(block.capacity_bytes);
  cache.stats.peak_live_bytes = std::max(cache.stats.peak_live_bytes, cache.stats.live_bytes);
  return block;
}

void release_buffer(void* data, std::size_t capacity_bytes) noexcept {
  if (data == nullptr) return;
  if (!kCacheEnabled || capacity_bytes < kMinCachedBytes || thread_cache_destroyed) {
    std::free(data);
    return;
  }
  ThreadCache& cache = thread_cache();
  const auto size = static_cast<std::int64_t>(capacity_bytes);
  // Another thread's block lowers this one's count below what it acquired;
  // a thread that only releases has a peak of 0 and keeps nothing.
  cache.stats.live_bytes -= size;
  const std::int64_t max_idle = std::min(kMaxCachedBytesPerThread, kIdleOverPeakLive * cache.stats.peak_live_bytes);
  while (cache.stats.cached_bytes + size > max_idle && cache.evict_oldest()) {
  }
  if (cache.stats.cached_bytes + size > max_idle) {
    std::free(data);
    return;
  }
  try {
    cache.free_blocks[capacity_bytes].push_back({data, ++cache.num_releases});
    cache.stats.cached_bytes += size;
  } catch (...) {
    std::free(data);  // no memory for bookkeeping: just give the block back
  }
}

BufferCacheStats buffer_cache_stats() { return thread_cache().stats; }

void clear_buffer_cache() {
  ThreadCache& cache = thread_cache();
  for (auto& [size, blocks] : cache.free_blocks)
    for (const IdleBlock& block : blocks) std::free(block.data);
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
