// MoeLayer: the routed MoE block, y = sum_k w_k * expert_{id_k}(x), forward
// and backward. An expert is SwiGLU: expert_e(x) = (silu(x wi0_e) * (x wi1_e)) wo_e.
//
// Steps (single rank; later the dispatch step becomes a pluggable
// dispatcher over R ranks):
//   route -> sort (token, k) pairs by expert -> grouped GEMMs + SwiGLU
//   -> combine with the routing weights.
// The backward returns dx (through the experts and through the router),
// dgate (through the routing weights), dwi0, dwi1, dwo.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/memory_ledger.h"
#include "core/tensor.h"
#include "core/timer.h"
#include "kernels/compute_dtype.h"
#include "moe/router.h"

namespace epmoe {

struct MoeLayerConfig {
  std::int64_t hidden = 0;       // H
  std::int64_t ffn = 0;          // F
  RouterConfig router;           // router.num_experts is E
  ComputeDType compute_dtype = ComputeDType::f32;

  void validate() const;  // ConfigError naming the key
};

// Views of the layer's parameters (not owned).
struct MoeWeights {
  const Tensor* gate = nullptr;  // [H, E]
  const Tensor* wi0 = nullptr;   // [E, H, F]
  const Tensor* wi1 = nullptr;   // [E, H, F]
  const Tensor* wo = nullptr;    // [E, F, H]
  const Tensor* bias = nullptr;  // [E] or null (sigmoid_grouped selection bias)
};

struct MoeForwardOutput {
  Tensor y;             // [N, H]
  Tensor topk_ids;      // [N, K] i32
  Tensor topk_weights;  // [N, K] f32
};

struct MoeGradients {
  Tensor dx;     // [N, H]
  Tensor dgate;  // [H, E]
  Tensor dwi0;   // [E, H, F]
  Tensor dwi1;   // [E, H, F]
  Tensor dwo;    // [E, F, H]
};

struct MoeLayerStats {
  std::vector<std::int64_t> tokens_per_expert;  // pairs routed to each expert, last forward
  PhaseTimes phase_seconds;                     // route, permute, experts, combine, backward_*
  std::int64_t saved_activation_peak_bytes = 0;
};

class MoeLayer {
 public:
  // `ledger` (optional, not owned) sees every activation saved for backward.
  explicit MoeLayer(MoeLayerConfig config, MemoryLedger* ledger = nullptr);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  const MoeLayerConfig& config() const { return config_; }

  // Validates shapes (InternalError for a mismatch; callers validate files
  // first) and keeps what backward needs.
  MoeForwardOutput forward(const Tensor& x, const MoeWeights& weights);
  // Uses the last forward's saved state; dy [N, H]. Releases that state.
  MoeGradients backward(const Tensor& dy);

  const MoeLayerStats& stats() const { return stats_; }

 private:
  struct Saved;
  MoeLayerConfig config_;
  MemoryLedger* ledger_;
  Router router_;
  std::unique_ptr<Saved> saved_;
  MoeLayerStats stats_;
};

}  // namespace epmoe
