// HardwareSpec: one accelerator and the links it reaches its peers over.
// Presets for TPU v5p / v7x and H100 / H200 / B200 (sources in docs/PLAN.md),
// or any device from a YAML file with the same field names
// (configs/hardware/*.yaml).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epmoe::hardware {

// How devices inside one scale-up domain are wired.
enum class Interconnect {
  torus,     // TPU ICI: each chip has links_per_device links to torus neighbours
  switched,  // NVLink + NVSwitch: every GPU reaches every other at full bandwidth
};

// All values are per device: what one JAX / CUDA device owns. A TPU7x chip
// is two devices (its two TensorCores are separate devices, no megacore), so
// its preset halves the chip's HBM, FLOP rate and ICI bandwidth.
struct HardwareSpec {
  std::string name;
  std::int64_t devices_per_chip = 1;
  double memory_bytes = 0;        // HBM per device
  double memory_bytes_per_s = 0;  // HBM bandwidth per device (modelled time's memory-bound steps)
  double peak_bf16_flops = 0;     // dense, per device
  double peak_fp8_flops = 0;      // dense, per device
  Interconnect interconnect = Interconnect::torus;
  std::int64_t scale_up_devices = 0;  // devices one ICI / NVLink domain holds
  // torus: bandwidth of one link in one direction; switched: one GPU's total
  // NVLink bandwidth in one direction (what it can inject).
  double link_bytes_per_s = 0;
  std::int64_t links_per_device = 0;  // torus only
  double scale_out_bytes_per_s = 0;   // DCN / InfiniBand per device, one direction

  // ConfigError naming `what` and the field.
  void validate(const std::string& what) const;
};

// tpu-v5p, tpu-v7x, h100, h200, b200.
std::vector<std::string> hardware_preset_names();
// A preset name, or else a path to a YAML file. ConfigError / FileError
// naming `key`, the value and what is accepted.
HardwareSpec load_hardware(const std::string& key, const std::string& name_or_path);

std::string to_string(Interconnect interconnect);

}  // namespace epmoe::hardware
