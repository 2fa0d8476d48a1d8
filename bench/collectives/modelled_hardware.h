// clock=modelled for the benchmarks (DESIGN.md §4.11): the hardware presets
// of hardware/hardware.h turned into threads-transport options by
// hardware::modelled_clock_options, as `epmoe layer clock=modelled` takes them.
// Compute is always modelled (FLOPs at peak bf16 x compute_efficiency,
// memory-bound steps at HBM bandwidth), so every number is a pure function
// of the configuration: one run per configuration, no repetitions.
#pragma once

#include <string>
#include <vector>

#include "bench_args.h"
#include "core/modelled_clock.h"
#include "transport/threads/launcher.h"

namespace epmoe::bench {

bool modelled_clock(const BenchArgs& args);  // clock=modelled

struct ModelledHardware {
  std::string name;
  double peak_flops = 0;  // bf16, per device
  transport::threads::ThreadsOptions threads;
};

// The devices of key `hardware` ("all" = every preset; else comma-separated
// preset names or YAML files), with links for `num_ranks` ranks, latency
// `latency_us` per message and hop (the presets state none) and
// compute_efficiency from `args`.
std::vector<std::string> hardware_names(const BenchArgs& args);
ModelledHardware modelled_hardware(const std::string& name, int num_ranks, double latency_us, const BenchArgs& args);

// "ring 100 GB/s 2 us" / "two_level 8x450 GB/s, 50 GB/s out"
std::string describe_links(const transport::threads::EmulatedLinkOptions& links);

// Microseconds, for tables.
inline double to_us(Picoseconds t) { return static_cast<double>(t) * 1e-6; }

}  // namespace epmoe::bench
