// The device's rates on the modelled clock (clock=modelled, DESIGN.md §4.11;
// the clock itself: transport/threads/virtual_timeline.h, which re-exports
// this struct). Filled from a hardware preset by
// hardware/modelled_clock_options.h.
#pragma once

namespace epmoe::hardware {

// Device rates for compute_time=modelled, or compute_time=measured.
struct ModelledTimeOptions {
  bool enabled = false;             // clock=modelled
  bool measured_compute = false;    // compute_time=measured
  double peak_flops = 0;            // per device, dense matmul
  double compute_efficiency = 0.5;  // of peak
  double memory_bytes_per_s = 0;    // HBM
  double compute_scale = 1.0;       // measured CPU seconds x this

  // Throws ConfigError naming the key and its range. The ranges keep every
  // rate far from what makes one operation's modelled time pass the clock's
  // range (core/modelled_clock.h); what still does (a huge operation at a
  // low rate) is refused by the clock itself, naming the operation.
  void validate() const;
};

constexpr double kMinComputeEfficiency = 1e-6;
constexpr double kMaxComputeScale = 1e6;
constexpr double kMinPeakFlops = 1e6;             // 1e-6 TFLOP/s
constexpr double kMinMemoryBytesPerSecond = 1e6;  // 1e-3 GB/s

}  // namespace epmoe::hardware
