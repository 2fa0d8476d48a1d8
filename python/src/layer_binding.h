// Adds WholeWorldLayer to the _epmoe module (layer_binding.cc).
#pragma once

#include <nanobind/nanobind.h>

namespace epmoe::python {

void bind_layer(nanobind::module_& m);

}  // namespace epmoe::python
