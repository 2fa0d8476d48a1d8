// _epmoe.MoeLayer and _epmoe.MoeStep (<epmoe/moe_layer.h>): one rank's MoE
// layer on an EpGroup, configured with the key vocabulary of `epmoe layer`
// (layer_config_from_keys), its split-phase calls and their outputs into
// the caller's arrays. python/epmoe/moe_layer.py is the public face.
#pragma once

#include <nanobind/nanobind.h>

namespace epmoe::python {

void bind_moe_layer(nanobind::module_& m);

}  // namespace epmoe::python
