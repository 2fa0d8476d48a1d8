#include "kernels/concatenated_weights.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/error.h"
#include "core/threading.h"
#include "kernels/gemm.h"

namespace epmoe {
namespace {

struct ConcatKey {
  const float* w0;
  const float* w1;
  std::int64_t k, n;
  bool operator==(const ConcatKey&) const = default;
};

struct ConcatKeyHash {
  std::size_t operator()(const ConcatKey& key) const {
    std::size_t h = std::hash<const void*>{}(key.w0);
    h = h * 0x9e3779b97f4a7c15ull + std::hash<const void*>{}(key.w1);
    h = h * 0x9e3779b97f4a7c15ull + std::hash<std::int64_t>{}(key.k);
    return h * 0x9e3779b97f4a7c15ull + std::hash<std::int64_t>{}(key.n);
  }
};

struct ConcatEntry {
  std::mutex mutex;           // guards the fields below
  std::uint64_t version = 0;  // 0: not built yet
  std::vector<float> matrix;  // [k, 2n]
};

struct ConcatCache {
  std::mutex mutex;
  std::unordered_map<ConcatKey, std::shared_ptr<ConcatEntry>, ConcatKeyHash> entries;
  std::atomic<std::int64_t> bytes{0}, builds{0}, reuses{0};
};

ConcatCache& concat_cache() {
  static ConcatCache cache;
  return cache;
}

std::shared_ptr<ConcatEntry> cache_entry(const ConcatKey& key) {
  ConcatCache& cache = concat_cache();
  const std::lock_guard lock(cache.mutex);
  auto it = cache.entries.find(key);
  if (it != cache.entries.end()) return it->second;
  const std::int64_t entry_bytes = static_cast<std::int64_t>(sizeof(float)) * 2 * key.k * key.n;
  if (cache.entries.size() >= static_cast<std::size_t>(kMaxConcatenatedWeightEntries) ||
      cache.bytes + entry_bytes > kMaxConcatenatedWeightBytes) {
    // Freed buffers may come back at another key's address: see the header.
    cache.entries.clear();
    cache.bytes = 0;
    clear_gemm_weight_cache();
  }
  auto entry = std::make_shared<ConcatEntry>();
  cache.entries.emplace(key, entry);
  return entry;
}

// Row i of the result: w0's row i, then w1's row i. Rows are independent,
// so the copy is split over the caller's threads (about 55 GB/s on 2 cores
// against 37 on one, DESIGN.md §7).
void build(const ConcatKey& key, float* matrix) {
  const std::int64_t n = key.n;
  parallel_for(key.k, 64, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      std::memcpy(matrix + i * 2 * n, key.w0 + i * n, sizeof(float) * n);
      std::memcpy(matrix + i * 2 * n + n, key.w1 + i * n, sizeof(float) * n);
    }
  });
}

}  // namespace

ConcatenatedWeights concatenated_weights(std::span<const float* const> w0_groups,
                                         std::span<const float* const> w1_groups, std::int64_t k, std::int64_t n,
                                         std::uint64_t version) {
  if (version == 0) throw InternalError("concatenated weights: version 0 (unknown values) cannot be cached");
  if (w0_groups.size() != w1_groups.size())
    throw InternalError("concatenated weights: " + std::to_string(w0_groups.size()) + " first and " +
                        std::to_string(w1_groups.size()) + " second matrices");
  ConcatenatedWeights out;
  out.groups.reserve(w0_groups.size());
  out.holds.reserve(w0_groups.size());
  ConcatCache& cache = concat_cache();
  for (std::size_t g = 0; g < w0_groups.size(); ++g) {
    const ConcatKey key{w0_groups[g], w1_groups[g], k, n};
    if (key.w0 == nullptr || key.w1 == nullptr)
      throw InternalError("concatenated weights: a null matrix pointer in group " + std::to_string(g));
    std::shared_ptr<ConcatEntry> entry = cache_entry(key);
    {
      const std::lock_guard lock(entry->mutex);
      if (entry->version != version) {
        if (entry->matrix.empty()) {
          entry->matrix.resize(static_cast<std::size_t>(2 * k * n));
          cache.bytes += static_cast<std::int64_t>(sizeof(float)) * 2 * k * n;
        }
        build(key, entry->matrix.data());
        entry->version = version;
        ++cache.builds;
      } else {
        ++cache.reuses;
      }
      out.groups.push_back(entry->matrix.data());
    }
    out.holds.push_back(std::move(entry));
  }
  return out;
}

ConcatenatedWeightCacheStats concatenated_weight_cache_stats() {
  ConcatCache& cache = concat_cache();
  const std::lock_guard lock(cache.mutex);
  return {static_cast<std::int64_t>(cache.entries.size()), cache.bytes.load(), cache.builds.load(),
          cache.reuses.load()};
}

void clear_concatenated_weight_cache() {
  ConcatCache& cache = concat_cache();
  const std::lock_guard lock(cache.mutex);
  cache.entries.clear();
  cache.bytes = 0;
  clear_gemm_weight_cache();
}

}  // namespace epmoe
