#include "hardware/modelled_time_options.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace epmoe::hardware {

void ModelledTimeOptions::validate() const {
  if (!enabled) return;
  auto positive = [](double value, const char* key) {
    if (!(value > 0.0) || !std::isfinite(value)) {
      std::ostringstream msg;
      msg << key << " = " << value << ": must be a finite number > 0";
      throw ConfigError(msg.str());
    }
  };
  if (measured_compute) {
    positive(compute_scale, "compute_scale");
    return;
  }
  positive(peak_flops, "hardware peak_bf16_tflops");
  positive(memory_bytes_per_s, "hardware memory_gb_per_s");
  if (!(compute_efficiency > 0.0 && compute_efficiency <= 1.0)) {
    std::ostringstream msg;
    msg << "compute_efficiency = " << compute_efficiency << ": must be in (0, 1]";
    throw ConfigError(msg.str());
  }
}

}  // namespace epmoe::hardware
