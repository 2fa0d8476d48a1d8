// MoeLayer: the routed MoE block, y = sum_k w_k * expert_{id_k}(x), forward
// and backward. An expert is SwiGLU: expert_e(x) = (silu(x wi0_e) * (x wi1_e)) wo_e.
//
// Steps, per chunk of this rank's tokens (ep/dispatcher.h):
//   route -> dispatch (an ep::Dispatcher: local, all-to-all or ring of
//   experts) -> local experts (grouped GEMMs + SwiGLU, weighted into slots,
//   moe/local_experts.h) -> combine.
// The backward returns dx (through the experts and through the router),
// dgate (through the routing weights), dwi0, dwi1, dwo.
//
// Under expert parallelism each rank runs one MoeLayer on its own tokens with
// its own experts' weights (wi0/wi1/wo hold E_l = E / R experts); the gate is
// replicated, so dgate is this rank's contribution, to be summed over ranks.
//
// Dynamic replicas (balance=dynamic, ep/replica_exchange.h): the experts
// compute on E_l home experts + B redundant slots, through per-group weight
// pointers: the home experts are the caller's weights as they are (no copy),
// the slots live in the replica exchange, which receives them point-to-point
// from the experts' home ranks only when a slot's (expert, version) changed.
// The backward writes the home experts' dW straight into the result and the
// slots' into the exchange, which sends each home and adds the received ones
// there: dW of the E_l home experts, exactly as with replicas off.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <epmoe/config.h>

#include "core/memory_ledger.h"
#include "core/tensor.h"
#include "core/timer.h"
#include "ep/dispatcher.h"
#include "ep/replica_stats.h"
#include "kernels/compute_dtype.h"
#include "moe/router.h"

namespace epmoe {

// Views of the layer's parameters, wherever the caller keeps them (an epmoe
// Tensor converts; so does any f32 C-contiguous memory, e.g. a framework's
// or a std::vector's): read in place, never copied. They must stay alive
// and unchanged until the step's backward returns.
struct MoeWeights {
  TensorView gate;  // [H, E]
  TensorView wi0;   // [E_l, H, F], this rank's experts
  TensorView wi1;   // [E_l, H, F]
  TensorView wo;    // [E_l, F, H]
  TensorView bias;  // [E] or empty (sigmoid_grouped selection bias)
};

struct MoeForwardOutput {
  Tensor y;             // [N, H]
  Tensor topk_ids;      // [N, K] i32
  Tensor topk_weights;  // [N, K] f32
};

struct MoeGradients {
  Tensor dx;     // [N, H]
  Tensor dgate;  // [H, E], this rank's tokens' contribution
  Tensor dwi0;   // [E_l, H, F]
  Tensor dwi1;   // [E_l, H, F]
  Tensor dwo;    // [E_l, F, H]
};

struct MoeLayerStats {
  PhaseTimes phase_seconds;                      // route, dispatch, experts, combine, backward_* (accumulated)
  std::int64_t saved_activation_peak_bytes = 0;  // last forward, with a ledger
  std::int64_t recomputed_bytes = 0;             // last backward: tensors the remat policy rebuilt
};

class MoeLayer {
 public:
  // Single rank: every expert is local. `ledger` (optional, not owned) sees
  // every activation saved for backward.
  explicit MoeLayer(MoeLayerConfig config, MemoryLedger* ledger = nullptr);
  // Expert parallel: `dispatcher` decides which experts are local and moves
  // the tokens.
  MoeLayer(MoeLayerConfig config, std::unique_ptr<ep::Dispatcher> dispatcher, MemoryLedger* ledger = nullptr);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  const MoeLayerConfig& config() const { return config_; }

  // Validates shapes (InternalError for a mismatch; callers validate files
  // first) and keeps what backward needs: the views of x and the weights,
  // not copies. Every input (x, gate, wi0, wi1, wo, bias; dy and
  // extra_d_logits in backward) must be f32 and C-contiguous: a strided view
  // is refused with UsageError "moe layer: wi0 is not C-contiguous (shape
  // [..], strides [..] in elements): ..." before any work.
  // Non-finite numbers never pass silently (NumericError, core/finite_check.h):
  //  * inputs: a NaN or infinity in x, gate, wi0, wi1, wo or bias (dy and
  //    extra_d_logits in backward) is refused before any work or
  //    communication, naming the tensor and the first bad index:
  //    "moe layer 1: x[3, 17] = nan: inputs must be finite";
  //  * values the step produces (overflow from finite inputs): the router's
  //    logits and weights, each chunk's expert outputs, y; in backward the
  //    expert and router gradients, dx, dgate and dW are checked as they are
  //    made and the first bad one is reported with the layer and the phase:
  //    "moe layer 1: non-finite value in expert output (forward/experts) at
  //    row 5 of chunk 0 (local expert 2): inf". After such an error the step
  //    is abandoned: under expert parallelism the peers learn of it through
  //    the transport (their waits end), and the layer must not be backwarded.
  // Each check is one vectorised pass over a tensor the step reads or writes
  // anyway; wi0/wi1/wo are not re-checked when `weight_version` and their
  // buffers are those of an earlier forward that found them finite.
  // `weight_version` (dynamic replicas): identifies the values of the
  // experts' weights, the same on every rank of the step; replica slots are
  // not resent while it is unchanged. Default: a new version every forward
  // (always correct, always resends).
  MoeForwardOutput forward(TensorView x, const MoeWeights& weights,
                           std::optional<std::uint64_t> weight_version = std::nullopt);
  // Uses the last forward's saved state; dy [N, H]. Releases that state.
  // `extra_d_logits` [N, E] (optional, empty = none): a gradient of the router logits from
  // a loss outside the layer (a load-balance loss, moe/load_balance.h), added
  // to the combine weights' before dgate and dx are formed.
  MoeGradients backward(TensorView dy, TensorView extra_d_logits = {});

  // Split phase: forward() is begin_forward() then finish_forward(), and
  // backward() likewise, with the same bits. Between a begin and its finish
  // the caller may compute anything that does not touch x, dy or the
  // weights (a shared expert, the dense parts of another layer, an
  // all-reduce): the expert-parallel communication the begin started moves
  // meanwhile.
  //  * begin_forward: checks the inputs, routes, and starts the dispatch
  //    (chunk 0's tokens and, with replicas, the slot weights are in flight).
  //  * finish_forward: the experts and the combine, chunk by chunk.
  //  * begin_backward: checks dy and starts sending the cotangents.
  //  * finish_backward: the experts' backward, the gradients' return, the
  //    router's backward.
  // Out of this order (finish without begin, a second begin, a backward
  // without a forward) a call throws UsageError naming the call and the
  // order; the layer is left as it was. An Error inside a phase abandons the
  // step (as forward() does): the next call must be a new begin_forward.
  void begin_forward(TensorView x, const MoeWeights& weights,
                     std::optional<std::uint64_t> weight_version = std::nullopt);
  MoeForwardOutput finish_forward();
  void begin_backward(TensorView dy, TensorView extra_d_logits = {});
  MoeGradients finish_backward();

  // The router's output of the last forward, until backward releases it (a
  // load-balance loss reads the logits).
  const RouterOutput& last_routing() const;

  // random router: restarts its generator on stream `stream` of its seed, so
  // a trainer can make the draws a function of (step, layer, rank) and a
  // resumed run draws what an uninterrupted one would have.
  void set_random_router_stream(std::uint64_t stream) { router_.set_stream(stream); }

  // Dynamic replicas: what later steps' replica plans depend on
  // (ep::ReplicaExchange::planning_state), for checkpoints; empty without
  // replicas. Restoring an empty state is a no-op.
  std::vector<std::int64_t> balance_state() const;
  void restore_balance_state(const std::vector<std::int64_t>& state);

  const MoeLayerStats& stats() const { return stats_; }
  const ep::DispatchStats& dispatch_stats() const { return dispatcher_->stats(); }
  // The replica exchange's last step (ep/replica_stats.h); without replicas
  // an all-default ReplicaStats (empty, zero counts, ratios 1), so a reader
  // needs no branch.
  const ep::ReplicaStats& replica_stats() const;
  int num_local_experts() const { return dispatcher_->num_local_experts(); }

 private:
  struct Saved;
  // Where the step is: which calls may come next (begin_forward from idle or
  // forward_done; finish_forward from forward_begun; ...).
  enum class Stage { idle, forward_begun, forward_done, backward_begun };
  void expect_stage(Stage expected, const char* call) const;  // UsageError otherwise
  MoeLayerConfig config_;
  Stage stage_ = Stage::idle;
  MemoryLedger* ledger_;
  Router router_;
  std::unique_ptr<ep::Dispatcher> dispatcher_;
  std::unique_ptr<Saved> saved_;
  MoeLayerStats stats_;
  std::uint64_t auto_version_ = 0;
  // The expert weights last found finite: (caller's version, buffers).
  struct ExpertWeightsSeen {
    std::optional<std::uint64_t> version;
    const void* wi0 = nullptr;
    const void* wi1 = nullptr;
    const void* wo = nullptr;
    bool operator==(const ExpertWeightsSeen&) const = default;
  };
  ExpertWeightsSeen finite_weights_seen_;
  // LocalExpertWeights::version for the kernels' caches of derived weights
  // (bf16 copies, the [wi0 | wi1] concatenation): a new process-wide value
  // unless the caller's version and buffers are the last forward's.
  std::uint64_t kernel_weights_version(std::optional<std::uint64_t> weight_version, const MoeWeights& weights);
  ExpertWeightsSeen kernel_weights_seen_;
  std::uint64_t kernel_weights_version_ = 0;
};

}  // namespace epmoe
