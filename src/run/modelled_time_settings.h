// The keys of the second clock (clock=modelled, DESIGN.md §4.11) and of the
// trace, shared by `epmoe layer` and `train`, and their translation
// into the threads transport's options: the device's rates and the links
// come from a hardware preset or YAML file (hardware/hardware.h); the
// link_* keys, when given, override the preset's links.
//
// Links from the hardware: hardware/modelled_clock_options.h.
// Latency is link_latency_us (the presets state none).
#pragma once

#include <string>

#include "run/config_keys.h"
#include "run/expert_parallel_settings.h"

namespace epmoe::run {

KeyGroup modelled_time_keys();

// ConfigError when clock=modelled or trace_file= meets transport=mpi: said
// before the rank count is read (which under mpi needs mpirun).
void check_modelled_time_transport(const ConfigValues& values);

// Fills settings.modelled, settings.trace_file and, for clock=modelled,
// settings.links. ConfigError naming the key (clock=modelled with
// transport=mpi; a hardware file that is not there).
void configure_modelled_time(const ConfigValues& values, ExpertParallelSettings& settings);

}  // namespace epmoe::run
