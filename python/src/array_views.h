// Arrays between Python and epmoe's per-rank calls. In: a numpy array or a
// CPU torch tensor (buffer protocol or DLPack, through nanobind) read in
// place as a TensorView, or refused with a TypeError naming the call, the
// argument and what was wrong (dtype, layout, device, requires_grad), never
// converted: a silent copy would break "read in place" and cost a pass over
// the bytes. Out: a numpy array owning an epmoe::Tensor, for the outputs
// whose size only the call knows (a dispatch's rows); the Python side makes
// a torch tensor of it with torch.from_numpy (no copy).
//
// Every view keeps its Python array referenced (ArrayRef), so a step that
// reads x until its backward holds x alive.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <epmoe/dtype.h>
#include <epmoe/tensor.h>
#include <epmoe/tensor_view.h>

namespace epmoe::python {

// The DLPack / buffer-protocol import of one array; holding it keeps the
// array's memory alive.
using ArrayRef = nanobind::ndarray<nanobind::ro>;
using MutableArrayRef = nanobind::ndarray<>;

// `call` and `name` name the argument in errors: "MoeLayer.begin_forward: x".
// Rank 1 or more; C-contiguous; on the CPU; of `dtype`.
TensorView input_view(nanobind::handle array, DType dtype, const char* call, const char* name, ArrayRef& ref);
// An optional input: None gives an empty view.
TensorView optional_input_view(nanobind::handle array, DType dtype, const char* call, const char* name, ArrayRef& ref);
// A caller's output buffer, writable; None gives an empty view (epmoe then
// allocates that output).
MutableTensorView output_view(nanobind::handle array, DType dtype, const char* call, const char* name,
                              MutableArrayRef& ref);

// A numpy array owning `tensor` (moved into a capsule): no copy.
nanobind::object to_numpy(Tensor&& tensor);

}  // namespace epmoe::python
