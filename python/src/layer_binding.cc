// epmoe._epmoe.WholeWorldLayer: the public C++ layer (<epmoe/whole_world_layer.h>)
// on numpy arrays and torch tensors. Arrays come in as nanobind ndarrays
// (the buffer protocol or DLPack): float32, C-contiguous, on the CPU, read in
// place; nanobind refuses anything else with a TypeError instead of copying.
// python/epmoe/layer.py checks first and names the argument.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <epmoe/error.h>
#include <epmoe/whole_world_layer.h>

#include "layer_binding.h"

namespace nb = nanobind;

namespace epmoe::python {
namespace {

template <typename T, typename View>
View view_of(const nb::dict& arrays, const char* name, bool required) {
  if (!arrays.contains(name)) {
    if (required) throw ConfigError(std::string("MoeLayer: the array ") + name + " is missing");
    return View();
  }
  using Array = nb::ndarray<T, nb::c_contig, nb::device::cpu>;
  Array array;
  if (!nb::try_cast(arrays[name], array, /*convert=*/false)) {
    throw nb::type_error((std::string("MoeLayer: ") + name + " must be a C-contiguous CPU array of " +
                          (std::is_same_v<std::remove_const_t<T>, float> ? "float32" : "int32"))
                             .c_str());
  }
  std::vector<std::int64_t> shape;
  for (std::size_t d = 0; d < array.ndim(); ++d) shape.push_back(static_cast<std::int64_t>(array.shape(d)));
  // The shape is copied into the view, so the vector may go.
  return View(array.data(), dtype_of<std::remove_const_t<T>>(), std::span<const std::int64_t>(shape));
}

void run(WholeWorldLayer& layer, const nb::dict& arrays, const nb::dict& outputs) {
  const LayerArrays in{.x = view_of<const float, TensorView>(arrays, "x", true),
                       .gate = view_of<const float, TensorView>(arrays, "gate", true),
                       .wi0 = view_of<const float, TensorView>(arrays, "wi0", true),
                       .wi1 = view_of<const float, TensorView>(arrays, "wi1", true),
                       .wo = view_of<const float, TensorView>(arrays, "wo", true),
                       .bias = view_of<const float, TensorView>(arrays, "bias", false),
                       .dy = view_of<const float, TensorView>(arrays, "dy", false)};
  const LayerOutputs out{.y = view_of<float, MutableTensorView>(outputs, "y", true),
                         .topk_ids = view_of<std::int32_t, MutableTensorView>(outputs, "topk_ids", true),
                         .topk_weights = view_of<float, MutableTensorView>(outputs, "topk_weights", true),
                         .dx = view_of<float, MutableTensorView>(outputs, "dx", false),
                         .dgate = view_of<float, MutableTensorView>(outputs, "dgate", false),
                         .dwi0 = view_of<float, MutableTensorView>(outputs, "dwi0", false),
                         .dwi1 = view_of<float, MutableTensorView>(outputs, "dwi1", false),
                         .dwo = view_of<float, MutableTensorView>(outputs, "dwo", false)};
  // The dicts keep every array alive; the ranks compute without the GIL, so
  // other Python threads run meanwhile.
  nb::gil_scoped_release release;
  layer.run(in, out);
}

}  // namespace

void bind_layer(nb::module_& m) {
  nb::class_<WholeWorldLayer>(m, "WholeWorldLayer")
      .def(nb::init<const std::map<std::string, std::string>&>(), nb::arg("keys"))
      .def_prop_ro("top_k", &WholeWorldLayer::top_k)
      .def("run", &run, nb::arg("arrays"), nb::arg("outputs"),
           "Runs the layer on the arrays (x, gate, wi0, wi1, wo, optional bias and dy) into the outputs (y, "
           "topk_ids, topk_weights, and with dy: dx, dgate, dwi0, dwi1, dwo)")
      .def("metrics_json", &WholeWorldLayer::metrics_json,
           "metrics.json's text for the last run (made when asked: it costs more than a small layer's call)");
}

}  // namespace epmoe::python
