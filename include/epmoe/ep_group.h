// epmoe::EpGroup: one rank's member of an expert-parallel group, as
// DeepEP's Buffer or NCCL EP's group is: made once per rank on a
// communicator the caller owns, shared by every MoE layer of the model
// (<epmoe/moe_layer.h>), holding the exchange buffers once per rank at their
// high-water mark.
//
//   epmoe::ThreadsWorld world(4);                      // or make_mpi_communicator(MPI_COMM_WORLD)
//   epmoe::EpGroup group(world.communicator(rank), {.dispatch = epmoe::DispatchKind::ring,
//                                                   .num_experts = 16, .top_k = 2, .hidden = 1024});
//
// Construction is collective: every rank of the communicator constructs its
// group at the same point, and the ranks compare their configurations, so a
// rank whose num_experts, top_k, hidden, dispatch or any other group key
// differs is refused on every rank with a ConfigError naming the rank and
// the key (never a hang: a rank that never arrives is a PeerError after
// config.timeout naming it).
//
// Dispatch and combine without the experts, for callers who bring their own
// expert compute (DeepEP's dispatch / combine):
//
//   epmoe::Dispatched d = group.dispatch(x, topk_ids, topk_weights);
//   //   d.x: the received rows, sorted by local expert; d.num_rows_per_expert [E_l]
//   Tensor out = my_experts(d.x, d.num_rows_per_expert);          // [rows, H]
//   Tensor y = group.combine(d.handle, out);                       // sum_k w_k out_k, per token
//   // backward, in reverse: combine's backward is a dispatch of dy,
//   epmoe::CombineGradients gc = group.combine_backward(d.handle, dy, out);
//   // ... my experts' backward: d_rows from gc.d_expert_outputs ...
//   // and dispatch's backward is a combine of the rows' gradients:
//   epmoe::DispatchGradients gd = group.dispatch_backward(d.handle, d_rows, gc.d_row_weights);
//
// The handle carries the step's layout from dispatch to combine to both
// backwards: no count is exchanged after the dispatch. Every call out of
// that order is refused with a UsageError naming the call. Any number of
// handles may be in flight at once (up to kEpGroupMaxStepsInFlight), e.g.
// two micro-batches; every rank must start its steps (dispatch, and a
// layer's begin_forward) in the same order.
//
// Expert ids: the dispatch routes by *physical* expert, rank r holding
// [r * experts_per_rank(), (r + 1) * experts_per_rank()); without replicas
// configured that is the expert id itself (experts_per_rank() = E / R). A
// caller running EPLB-style placement maps logical to physical ids first
// (as vLLM and SGLang do before DeepEP's dispatch). The dispatch-only calls
// move the whole step as one chunk; config.num_chunks is the MoE layer's
// pipeline.
//
// Threads: a group and its handles belong to their rank's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <epmoe/communicator.h>
#include <epmoe/config.h>
#include <epmoe/memory_ledger.h>
#include <epmoe/step_stats.h>
#include <epmoe/tensor.h>
#include <epmoe/tensor_view.h>

namespace epmoe {

namespace ep {
class Dispatcher;  // internal: the group's transfer engine
}

class EpGroup;

// One dispatch-only step (see above). Move-only; empty when default-made.
class DispatchHandle {
 public:
  DispatchHandle();
  DispatchHandle(DispatchHandle&&) noexcept;
  DispatchHandle& operator=(DispatchHandle&&) noexcept;
  ~DispatchHandle();

  // The step's statistics so far (bytes per collective, rows per expert).
  const DispatchStats& stats() const;

  struct State;  // opaque: the step's layout (src/ep/ep_group.cc)

 private:
  friend class EpGroup;
  std::unique_ptr<State> state_;
};

struct Dispatched {
  Tensor x;                                       // [num_rows, H] f32, sorted by local expert
  std::vector<std::int64_t> num_rows_per_expert;  // [experts_per_rank()], summing to num_rows
  Tensor weights;                                 // [num_rows] f32: each row's routing weight
  DispatchHandle handle;
};

struct CombineGradients {
  Tensor d_expert_outputs;  // [num_rows, H]: weight x dy of the row's token
  Tensor d_row_weights;     // [num_rows]: <dy of the row's token, the row's expert output>
};

struct DispatchGradients {
  Tensor dx;              // [N_l, H]: every row's gradient summed into its token
  Tensor d_topk_weights;  // [N_l, K]
};

class EpGroup {
 public:
  // Collective over `comm` (see above). `ledger` (optional, not owned,
  // outliving the group) is charged the pooled buffers under
  // "buffer/dispatch".
  EpGroup(Communicator& comm, const EpConfig& config, MemoryLedger* ledger = nullptr);
  // One rank holding every expert, no communicator and no communication
  // (config.dispatch, dedup, fp8 and replicas do not apply and are refused).
  explicit EpGroup(const EpConfig& config, MemoryLedger* ledger = nullptr);
  ~EpGroup();
  // Movable: layers made on a group keep working after it moves.
  EpGroup(EpGroup&&) noexcept;
  EpGroup& operator=(EpGroup&&) noexcept;

  const EpConfig& config() const;
  int rank() const;
  int size() const;
  int num_local_experts() const;  // E_l = E / R: the rank's home experts
  int first_local_expert() const;
  int experts_per_rank() const;  // E_l, plus the replica slots when configured
  // The communicator (UsageError for a single-rank group, which has none).
  Communicator& communicator();
  // Bytes of the layouts and exchange buffers the group keeps across steps.
  std::int64_t buffer_bytes() const;
  int steps_in_flight() const;

  // Dispatch-only API (see above). x [N_l, H] f32; topk_ids [N_l, K] i32
  // (physical experts); topk_weights [N_l, K] f32; all C-contiguous, read
  // in place; x must stay alive and unchanged until the step ends.
  Dispatched dispatch(TensorView x, TensorView topk_ids, TensorView topk_weights);
  // expert_outputs [num_rows, H] in the rows' order -> y [N_l, H]; into
  // `y` when given (then the returned Tensor is empty).
  Tensor combine(DispatchHandle& handle, TensorView expert_outputs, MutableTensorView y = {});
  // dy [N_l, H]; expert_outputs as given to combine (the weights' gradient
  // needs them).
  CombineGradients combine_backward(DispatchHandle& handle, TensorView dy, TensorView expert_outputs);
  // d_rows [num_rows, H], d_row_weights [num_rows]; ends the step.
  DispatchGradients dispatch_backward(DispatchHandle& handle, TensorView d_rows, TensorView d_row_weights);

  // epmoe's own layers run on this (not for callers).
  ep::Dispatcher& dispatcher();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace epmoe
