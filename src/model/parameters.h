// The trainable state of a model on one rank: every parameter with its
// gradient and its AdamW moments, and the non-trained buffers (the
// sigmoid_grouped selection bias). A parameter is either replicated (the same
// values on every rank; its gradient is all-reduced) or sharded by expert
// parallelism (this rank's experts only; its gradient is already complete
// when the MoE layer's backward returns).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace epmoe {

struct Parameter {
  std::string name;  // "layer_0.wi0"; also its checkpoint file name
  Tensor value;
  Tensor grad;            // same shape, written by the backward
  Tensor adam_m, adam_v;  // AdamW moments, zero at start
  bool replicated = true;
  bool decay = true;  // AdamW weight decay applies (matrices yes; norms, embedding no)
};

struct Buffer {
  std::string name;  // "layer_0.selection_bias"
  Tensor value;      // replicated, updated outside the optimizer
};

// State that is not a tensor of fixed shape but that later steps depend on
// (a layer's replica planning state): a checkpoint saves it as a 1-D i64
// array (rank 0's copy; it is the same on every rank) when save() returns a
// non-empty one, and restores it on every rank.
struct OpaqueState {
  std::string name;
  std::function<std::vector<std::int64_t>()> save;
  std::function<void(const std::vector<std::int64_t>&)> restore;
};

class ParameterSet {
 public:
  // Zero gradient and moments, value uninitialised (the model fills it).
  Parameter& add(std::string name, Shape shape, bool replicated, bool decay);
  Buffer& add_buffer(std::string name, Shape shape);  // zeros
  void add_state(OpaqueState state) { states_.push_back(std::move(state)); }

  std::deque<Parameter>& parameters() { return parameters_; }
  const std::deque<Parameter>& parameters() const { return parameters_; }
  std::deque<Buffer>& buffers() { return buffers_; }
  const std::deque<Buffer>& buffers() const { return buffers_; }
  const std::vector<OpaqueState>& states() const { return states_; }

  // Elements of the replicated parameters, all ranks' sharded ones excluded.
  std::int64_t replicated_elements() const;
  std::int64_t sharded_elements() const;  // this rank's

 private:
  // Deques: references returned by add() stay valid as more are added.
  std::deque<Parameter> parameters_;
  std::deque<Buffer> buffers_;
  std::vector<OpaqueState> states_;
};

}  // namespace epmoe
