#include "hardware/modelled_time_options.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace epmoe::hardware {

void ModelledTimeOptions::validate() const {
  if (!enabled) return;
  // [low, high] (or (0, high] when low is 0); NaN fails every comparison.
  auto in_range = [](double value, double low, double high, const char* key, const char* unit) {
    if (low == 0.0 ? value > 0.0 && value <= high : value >= low && value <= high) return;
    std::ostringstream msg;
    msg << key << " = " << value << ": must be in " << (low == 0.0 ? "(" : "[") << low << ", " << high << "]" << unit;
    throw ConfigError(msg.str());
  };
  if (measured_compute) {
    in_range(compute_scale, 0.0, kMaxComputeScale, "compute_scale", "");
    return;
  }
  constexpr double kLargest = std::numeric_limits<double>::max();
  in_range(peak_flops, kMinPeakFlops, kLargest, "hardware peak_bf16_tflops", " FLOP/s (1e-06 TFLOP/s at least)");
  in_range(memory_bytes_per_s, kMinMemoryBytesPerSecond, kLargest, "hardware memory_gb_per_s",
           " bytes/s (0.001 GB/s at least)");
  in_range(compute_efficiency, kMinComputeEfficiency, 1.0, "compute_efficiency", " (a fraction of the peak FLOP/s)");
}

}  // namespace epmoe::hardware
