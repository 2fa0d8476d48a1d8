// BufferCache: where Tensor's memory comes from. Large blocks are kept on
// free and handed out again, per thread (so per rank when ranks are threads),
// because fresh memory is expensive here: the first touch of a new page costs
// ~11 us per 4 KiB (~0.36 GB/s, DESIGN.md §7), so a layer step that mallocs
// and frees its 8 MiB buffers pays more in page faults than in GEMMs.
// Blocks are rounded up to size classes 1/8 apart (at most 12.5% waste).
//
// Bounded (issue 28 N7): ragged token counts give every step other sizes,
// and a cache that keeps a block of every size class it ever saw grows step
// after step (`epmoe train` at ranks=8: 0.99 GB of peak RSS at step 100,
// 1.35 GB at step 1000; idle blocks 3-5x what each rank ever had in use).
// So:
//  * a request that finds no block of its class takes the smallest idle one
//    of up to twice its class (its pages are in memory already) before any
//    fresh memory;
//  * a thread keeps idle at most twice the most it ever had in use at once
//    (peak_live_bytes); beyond that the blocks idle longest go back to the
//    OS. Its memory (in use + idle) is thus at most 3x its peak in use, and
//    stops growing once that peak is reached.
// Sanitizer builds bypass the cache, so ASan still sees every use after free.
#pragma once

#include <cstddef>
#include <cstdint>

namespace epmoe {

// A block handed out: at least the bytes asked for, 64-byte aligned (2 MiB
// aligned and advised as huge pages from 2 MiB up); capacity_bytes is its
// size class (a cached block may be of a larger class than the request's).
struct BufferBlock {
  void* data = nullptr;
  std::size_t capacity_bytes = 0;
};
BufferBlock acquire_buffer(std::size_t bytes);  // {nullptr, 0} for 0 bytes
// `capacity_bytes` must be the one acquire_buffer returned with `data`.
// Any thread may release a block; it joins that thread's cache.
void release_buffer(void* data, std::size_t capacity_bytes) noexcept;

struct BufferCacheStats {
  std::int64_t hits = 0;             // requests served from the cache (their class or a larger one)
  std::int64_t misses = 0;           // requests served with fresh memory
  std::int64_t cached_bytes = 0;     // idle, kept for reuse
  std::int64_t live_bytes = 0;       // acquired by this thread and not released by it (capacities)
  std::int64_t peak_live_bytes = 0;  // the most live_bytes ever were
  std::int64_t evicted_bytes = 0;    // idle blocks given back to the OS to stay within the bound
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
