// DispatchHandle: one step of a dispatcher, typed (as DeepEP's and NCCL EP's
// handles are): Dispatcher::dispatch() starts the step and returns it; the
// combine and the backward go through it, and it refuses any call out of the
// step's order with a UsageError naming the call and what was expected, so
// the order is checked instead of written down:
//
//   handle = dispatcher.dispatch(x, routing)
//   for c in chunks:  rows(c); ...experts...; combine(c, slot_outputs)
//   y = finish_forward()
//   start_backward(dy)
//   for c in chunks:  [redispatch_rows(c)]; cotangents(c); ...experts backward...;
//                     return_gradients(c, slot_dx, row_dweights)
//   {dx, d_topk_weights} = finish_backward()
//
// redispatch_rows(c) (x_sorted recomputed, ep/remat_policy.h) re-runs chunk
// c's dispatch and returns the same rows, bit for bit, as the forward's
// rows(c). A dispatcher has at most one handle in flight: the step's buffers
// are the dispatcher's (kept from step to step), the step's order is the
// handle's. Destroying a handle mid-step (an error unwinding) abandons the
// step; the dispatcher may then start a new one.
//
// x, the routing and dy are the caller's (views, read in place, f32 and
// C-contiguous) and must stay alive and unchanged until the matching
// finish_*() returned.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "ep/expert_rows.h"

namespace epmoe::ep {

class Dispatcher;
struct DispatchGradients;

class DispatchHandle {
 public:
  DispatchHandle() = default;  // empty: every call is refused
  DispatchHandle(DispatchHandle&& other) noexcept;
  DispatchHandle& operator=(DispatchHandle&& other) noexcept;
  DispatchHandle(const DispatchHandle&) = delete;
  DispatchHandle& operator=(const DispatchHandle&) = delete;
  ~DispatchHandle();

  ExpertRows rows(int chunk);
  void combine(int chunk, Tensor slot_outputs);  // [num_slots, H]
  Tensor finish_forward();                       // y [N_l, H]

  void start_backward(TensorView dy);
  ExpertRows redispatch_rows(int chunk);
  Tensor cotangents(int chunk);  // [num_slots, H]
  // slot_dx [num_slots, H]; row_dweights [num_rows] in the rows' order.
  void return_gradients(int chunk, Tensor slot_dx, std::vector<float> row_dweights);
  DispatchGradients finish_backward();

  // True from dispatch() until finish_backward() returned.
  bool in_step() const { return dispatcher_ != nullptr; }

 private:
  friend class Dispatcher;
  // The step's position: the next call allowed.
  enum class Next { rows, combine, finish_forward, start_backward, cotangents, return_gradients, finish_backward };
  DispatchHandle(Dispatcher& dispatcher, int num_chunks);
  void expect(Next next, int chunk, const char* call) const;  // UsageError otherwise
  void release() noexcept;                                    // ends the step on the dispatcher

  Dispatcher* dispatcher_ = nullptr;  // not owned; null when empty or finished
  int num_chunks_ = 0;
  Next next_ = Next::rows;
  int chunk_ = 0;              // the chunk the next per-chunk call is for
  bool redispatched_ = false;  // redispatch_rows(chunk_) already called this chunk
};

}  // namespace epmoe::ep
