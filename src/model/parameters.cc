#include "model/parameters.h"

namespace epmoe {

Parameter& ParameterSet::add(std::string name, Shape shape, bool replicated, bool decay) {
  Parameter p;
  p.name = std::move(name);
  p.value = Tensor(DType::f32, shape);
  p.grad = Tensor::zeros(DType::f32, shape);
  p.adam_m = Tensor::zeros(DType::f32, shape);
  p.adam_v = Tensor::zeros(DType::f32, shape);
  p.replicated = replicated;
  p.decay = decay;
  parameters_.push_back(std::move(p));
  return parameters_.back();
}

Buffer& ParameterSet::add_buffer(std::string name, Shape shape) {
  buffers_.push_back({std::move(name), Tensor::zeros(DType::f32, std::move(shape))});
  return buffers_.back();
}

std::int64_t ParameterSet::replicated_elements() const {
  std::int64_t n = 0;
  for (const Parameter& p : parameters_) n += p.replicated ? p.value.numel() : 0;
  return n;
}

std::int64_t ParameterSet::sharded_elements() const {
  std::int64_t n = 0;
  for (const Parameter& p : parameters_) n += p.replicated ? 0 : p.value.numel();
  return n;
}

}  // namespace epmoe
