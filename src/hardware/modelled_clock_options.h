// A device of a hardware preset or file (hardware/hardware.h) as the
// modelled clock runs it (clock=modelled, DESIGN.md §4.11): its compute and
// memory rates, and the links an expert-parallel group of R such devices
// uses, as plan/'s step time assumes them:
//  * torus (TPU ICI): one ring along a torus axis, at one link's rate each
//    way;
//  * switched (NVLink + NVSwitch): the switch at the GPU's NVLink rate; when
//    R exceeds the scale-up domain, two_level: switched groups of
//    scale_up_devices, with the scale-out (InfiniBand) rate between them.
// The presets state no latency: the caller sets links.latency_us (and the
// keys it overrides: compute_efficiency, compute_time=measured, link_*).
//
// Where it sits: hardware/ is on the floor of core/, below both plan/ (which
// reads the presets to project memory and step time) and transport/ (whose
// threads transport runs the links and the device rates). The option structs
// the clock takes (link_options.h, modelled_time_options.h) live here too,
// and transport::threads re-exports them, so every arrow points down:
// core <- hardware <- transport, and core <- hardware <- plan. (With the
// structs left in transport/, this translation could live neither below
// plan/ nor beside the presets without an arrow from hardware up to
// transport; so the run layer and the benchmarks each kept a copy of it.)
#pragma once

#include "hardware/hardware.h"
#include "hardware/link_options.h"
#include "hardware/modelled_time_options.h"

namespace epmoe::hardware {

struct ModelledClockOptions {
  ModelledTimeOptions time;   // enabled; compute modelled at the bf16 peak and the memory bandwidth
  EmulatedLinkOptions links;  // the group's links; not emulated on the wall clock (enabled = false)
};

ModelledClockOptions modelled_clock_options(const HardwareSpec& device, int num_ranks);

}  // namespace epmoe::hardware
