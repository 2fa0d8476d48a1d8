// DispatchHandle: one expert-parallel step, owned (as DeepEP's and NCCL
// EP's handles are): Dispatcher::start_step() returns it, and it holds
// everything the step is - the caller's views, the per-chunk layout the
// forward learnt (which the backward reuses: no count exchange after the
// forward), the collectives in flight, the step's statistics and its block
// of tags - and runs the step's one chunk pipeline on the dispatcher's
// transfer primitives:
//
//   handle = dispatcher.start_step(num_chunks)
//   handle.dispatch(x, routing)              plans, sends chunk 0
//   for c in chunks:  rows(c)                 waits for chunk c, sends c + 1
//                     ...experts...; combine(c, slot_outputs)
//   finish_forward(y)                         y [N_l, H] written
//   start_backward(dy)                        cotangents of chunk 0 in flight
//   for c in chunks:  [redispatch_rows(c)]    x_sorted recomputed (remat)
//                     cotangents(c)           waits for chunk c, sends c + 1
//                     ...experts backward...; return_gradients(c, slot_dx, row_dweights)
//   finish_backward(dx, d_topk_weights)       both [N_l, ...] written
//
// The pipeline's rule, once for every dispatcher: chunk c + 1's tokens are
// sent while the experts compute chunk c, and (unless
// cotangent_all_gather=plain) chunk c + 1's cotangents travel while chunk
// c's backward runs. redispatch_rows(c) re-runs chunk c's dispatch and
// returns the same rows, bit for bit, as the forward's rows(c).
//
// Every call out of this order is refused with a UsageError naming the call
// and the one expected. The outputs go where the caller says (its own
// buffers or a tensor it allocated): the handle allocates none.
//
// x and the routing are read by dispatch() (the routing is not kept: the
// layout holds what the backward needs); x must stay alive and unchanged
// until the step ends (a remat re-sends it), dy until finish_backward.
// Destroying a handle mid-step (an error unwinding) abandons the step; its
// layout and buffers go back to the dispatcher, which must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ep/expert_rows.h"
#include "ep/step_state.h"

namespace epmoe::ep {

class Dispatcher;

class DispatchHandle {
 public:
  DispatchHandle() = default;  // empty: every call is refused
  DispatchHandle(DispatchHandle&& other) noexcept;
  DispatchHandle& operator=(DispatchHandle&& other) noexcept;
  DispatchHandle(const DispatchHandle&) = delete;
  DispatchHandle& operator=(const DispatchHandle&) = delete;
  ~DispatchHandle();

  // x [N_l, H] f32 C-contiguous; routing for the same N_l tokens.
  void dispatch(TensorView x, const RoutingView& routing);
  ExpertRows rows(int chunk);
  void combine(int chunk, Tensor slot_outputs);  // [num_slots, H]
  void finish_forward(MutableTensorView y);      // [N_l, H] f32

  void start_backward(TensorView dy);
  ExpertRows redispatch_rows(int chunk);
  Tensor cotangents(int chunk);  // [num_slots, H]
  // slot_dx [num_slots, H]; row_dweights [num_rows] in the rows' order.
  void return_gradients(int chunk, Tensor slot_dx, std::vector<float> row_dweights);
  // dx [N_l, H], d_topk_weights [N_l, K] (zero for pairs a capacity
  // dropped). Ends the step: returns its statistics.
  DispatchStats finish_backward(MutableTensorView dx, MutableTensorView d_topk_weights);

  // True from start_step() until finish_backward() returned.
  bool in_step() const { return dispatcher_ != nullptr; }
  int num_chunks() const;
  std::int64_t num_tokens() const;
  // This step's block of tags: ep_tag(tag_base(), index, op) is free for a
  // caller's own messages of the step on the ops ep/collective_tags.h
  // reserves for them (the replica exchange).
  std::uint32_t tag_base() const;
  // The step's statistics so far (finish_backward returns the final ones).
  const DispatchStats& stats() const;

 private:
  friend class Dispatcher;
  // The step's position: the next call allowed.
  enum class Next {
    dispatch,
    rows,
    combine,
    finish_forward,
    start_backward,
    cotangents,
    return_gradients,
    finish_backward,
    done
  };
  DispatchHandle(Dispatcher& dispatcher, std::unique_ptr<StepState> state, int slot);
  void expect(Next next, int chunk, const char* call) const;  // UsageError otherwise
  void lend_buffers();
  void return_buffers() noexcept;
  void release() noexcept;  // returns the layout, the buffers and the tag block

  Dispatcher* dispatcher_ = nullptr;  // not owned; null when empty or finished
  std::unique_ptr<StepState> state_;
  int slot_ = -1;  // the dispatcher's tag block
  Next next_ = Next::dispatch;
  int chunk_ = 0;               // the chunk the next per-chunk call is for
  bool redispatched_ = false;   // redispatch_rows(chunk_) already called this chunk
  int chunks_sent_ = 0;         // forward: chunks whose dispatch started
  int cotangents_started_ = 0;  // backward: chunks whose cotangents started
};

}  // namespace epmoe::ep
