// The keys of the second clock (clock=modelled, DESIGN.md §4.11) and of the
// trace, shared by `epmoe layer`, `train` and `bench`, and their translation
// into the threads transport's options: the device's rates and the links
// come from a `plan` hardware preset or YAML file (plan/hardware.h); the
// link_* keys, when given, override the preset's links.
//
// Links from the hardware (one direction, per device):
//  * torus (TPU ICI): the EP group is a ring along one torus axis:
//    link_topology=ring at the preset's per-link bandwidth;
//  * switched (NVLink): link_topology=switched at the GPU's NVLink rate; when
//    R exceeds the scale-up domain, two_level with scale_up_devices per group
//    and the scale-out (InfiniBand) rate between groups.
// Latency is link_latency_us (the presets state none).
#pragma once

#include <string>

#include "cli/config_keys.h"
#include "cli/expert_parallel_settings.h"

namespace epmoe::cli {

KeyGroup modelled_time_keys();

// ConfigError when clock=modelled or trace_file= meets transport=mpi: said
// before the rank count is read (which under mpi needs mpirun).
void check_modelled_time_transport(const ConfigValues& values);

// Fills settings.modelled, settings.trace_file and, for clock=modelled,
// settings.links. ConfigError naming the key (clock=modelled with
// transport=mpi; a hardware file that is not there).
void configure_modelled_time(const ConfigValues& values, ExpertParallelSettings& settings);

}  // namespace epmoe::cli
