// Two weight matrices of one group side by side, [W0 | W1]: for W0 and W1 of
// [k, n], the [k, 2n] matrix whose row i is W0's row i followed by W1's row
// i, so that one product x [W0 | W1] yields x W0 and x W1 as the left and
// right halves of each output row (kernels/swiglu_up_projection.h).
//
// Built once per weight version and kept: a shared cache keyed by the two
// matrices' pointers and shape, rebuilt in place (same buffer, so no new
// pages to fault in) when the version changes, reused while it does not.
// Memory: each entry holds 2 k n floats, as many bytes as W0 and W1
// together (so the fused path doubles the up-projection weights' bytes); at
// most kMaxConcatenatedWeightEntries entries and kMaxConcatenatedWeightBytes,
// all dropped beyond either (or by clear_concatenated_weight_cache()). A
// working set above the bounds stays correct but rebuilds on every call.
//
// The gemm weight cache (kernels/gemm.h) keys what it derives from b (bf16
// copy, packed layout) by b's pointer and version. An in-place rebuild comes
// with a new version, so that cache sees the change; dropping entries frees
// buffers whose addresses a later entry may reuse at an unchanged version,
// so a drop also clears the gemm weight cache.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace epmoe {

// The concatenated matrices of G groups; the entries stay alive (and
// unchanged: an entry is only rebuilt for another version) while held.
struct ConcatenatedWeights {
  std::vector<const float*> groups;                // [G] of [k, 2n]
  std::vector<std::shared_ptr<const void>> holds;  // keeps each group's entry alive
};

// [w0_groups[g] | w1_groups[g]] for every group g at `version`, which must
// not be 0 (unknown values cannot be cached; InternalError). Equal non-zero
// versions with equal pointers promise equal values (LocalExpertWeights).
ConcatenatedWeights concatenated_weights(std::span<const float* const> w0_groups,
                                         std::span<const float* const> w1_groups, std::int64_t k, std::int64_t n,
                                         std::uint64_t version);

struct ConcatenatedWeightCacheStats {
  std::int64_t entries = 0;
  std::int64_t bytes = 0;   // of the concatenated matrices held
  std::int64_t builds = 0;  // matrices (re)built, since start
  std::int64_t reuses = 0;  // matrices served unchanged, since start
};
ConcatenatedWeightCacheStats concatenated_weight_cache_stats();
void clear_concatenated_weight_cache();
constexpr std::int64_t kMaxConcatenatedWeightEntries = 1024;
constexpr std::int64_t kMaxConcatenatedWeightBytes = std::int64_t{2} << 30;

}  // namespace epmoe
