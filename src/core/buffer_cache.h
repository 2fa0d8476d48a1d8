// BufferCache: where Tensor's memory comes from. Large blocks are kept on
// free and handed out again, per thread (so per rank when ranks are threads),
// because fresh memory is expensive here: the first touch of a new page costs
// ~11 us per 4 KiB (~0.36 GB/s, DESIGN.md §7), so a layer step that mallocs
// and frees its 8 MiB buffers pays more in page faults than in GEMMs.
// Blocks are rounded up to size classes 1/8 apart (at most 12.5% waste), so
// step-to-step changes in ragged token counts still hit the cache.
// Sanitizer builds bypass the cache, so ASan still sees every use after free.
#pragma once

#include <cstddef>
#include <cstdint>

namespace epmoe {

// 64-byte aligned (2 MiB aligned and advised as huge pages from 2 MiB up).
void* acquire_buffer(std::size_t bytes);
// `bytes` must be what was passed to acquire_buffer.
void release_buffer(void* data, std::size_t bytes) noexcept;

struct BufferCacheStats {
  std::int64_t hits = 0;
  std::int64_t misses = 0;
  std::int64_t cached_bytes = 0;
};
BufferCacheStats buffer_cache_stats();  // of the calling thread
void clear_buffer_cache();              // frees the calling thread's cached blocks

// Every buffer acquire_buffer handed out since the last reset, from the cache
// or fresh, process-wide (all threads: with ranks as threads, every rank and
// its helpers), so a test can hold a step to what it must allocate (e.g. no
// copy of a caller's weights, tests/ep/caller_memory_test.cc). Relaxed
// atomic counters: exact once the counted threads have synchronised with
// the reader (joined, or past a barrier).
struct BufferAllocationCounts {
  std::int64_t buffers = 0;        // acquire_buffer calls for more than 0 bytes
  std::int64_t bytes = 0;          // the bytes they asked for (before size classes)
  std::int64_t largest_bytes = 0;  // the largest single request
};
BufferAllocationCounts buffer_allocation_counts();
void reset_buffer_allocation_counts();

}  // namespace epmoe
