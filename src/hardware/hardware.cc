#include "hardware/hardware.h"

#include <filesystem>
#include <stdexcept>

#include "core/error.h"
#include "hardware/spec_file.h"

namespace epmoe::hardware {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kGB = 1e9;
constexpr double kTera = 1e12;
constexpr double kGbit = 1e9 / 8;  // bytes per second in one Gbit/s

// Every number below is quoted in docs/PLAN.md with its source.
HardwareSpec tpu_v5p() {
  // Cloud TPU v5p page: 95 GiB HBM, 459 TFLOP/s bf16 (and fp8), 1200 GB/s
  // bidirectional ICI per chip over a 3D torus (6 links), 50 Gbit/s DCN.
  // HBM bandwidth 2765 GB/s.
  return {.name = "tpu-v5p",
          .memory_bytes = 95 * kGiB,
          .memory_bytes_per_s = 2765 * kGB,
          .peak_bf16_flops = 459 * kTera,
          .peak_fp8_flops = 459 * kTera,
          .interconnect = Interconnect::torus,
          .scale_up_devices = 8960,
          .link_bytes_per_s = 1200 * kGB / (6 * 2),
          .links_per_device = 6,
          .scale_out_bytes_per_s = 50 * kGbit};
}

HardwareSpec tpu_v7x() {
  // Cloud TPU7x page, per chip: 192 GiB HBM, 2307 TFLOP/s bf16, 4614 fp8,
  // 9216-chip pod, 3D torus; Ironwood announcement: 1.2 TB/s bidirectional ICI
  // per chip. JAX's ChipVersion table: TPU7x has 2 TensorCores per chip and
  // no megacore, so each is a device (a 4x8x8 slice = 256 chips = 512
  // devices, the seed's fsdp 64 x ep 8): every per-chip number is halved.
  // DCN per chip is not in our sources: v5p's 50 Gbit/s is used (stated).
  constexpr double kDevicesPerChip = 2;
  // HBM bandwidth 7.37 TB/s per chip.
  return {.name = "tpu-v7x",
          .devices_per_chip = 2,
          .memory_bytes = 192 * kGiB / kDevicesPerChip,
          .memory_bytes_per_s = 7370 * kGB / kDevicesPerChip,
          .peak_bf16_flops = 2307 * kTera / kDevicesPerChip,
          .peak_fp8_flops = 4614 * kTera / kDevicesPerChip,
          .interconnect = Interconnect::torus,
          .scale_up_devices = 9216 * 2,
          .link_bytes_per_s = 1200 * kGB / (6 * 2) / kDevicesPerChip,
          .links_per_device = 6,
          .scale_out_bytes_per_s = 50 * kGbit / kDevicesPerChip};
}

HardwareSpec nvidia(const std::string& name, double memory_gb, double memory_tb_per_s, double bf16_tflops,
                    double nvlink_bidirectional_gb, double network_gbit) {
  // An HGX / DGX node: 8 GPUs on NVSwitch, one 400 Gbit/s NIC per GPU.
  return {.name = name,
          .memory_bytes = memory_gb * kGB,
          .memory_bytes_per_s = memory_tb_per_s * kTera,
          .peak_bf16_flops = bf16_tflops * kTera,
          .peak_fp8_flops = 2 * bf16_tflops * kTera,
          .interconnect = Interconnect::switched,
          .scale_up_devices = 8,
          .link_bytes_per_s = nvlink_bidirectional_gb / 2 * kGB,
          .links_per_device = 0,
          .scale_out_bytes_per_s = network_gbit * kGbit};
}

}  // namespace

std::string to_string(Interconnect interconnect) { return interconnect == Interconnect::torus ? "torus" : "switched"; }

void HardwareSpec::validate(const std::string& what) const {
  auto positive = [&](double v, const char* field) {
    if (!(v > 0)) throw ConfigError(what + ": " + field + "=" + std::to_string(v) + ": must be > 0");
  };
  positive(memory_bytes, "memory_gb");
  positive(peak_bf16_flops, "peak_bf16_tflops");
  positive(peak_fp8_flops, "peak_fp8_tflops");
  positive(link_bytes_per_s, "link_gb_per_s");
  positive(scale_out_bytes_per_s, "scale_out_gb_per_s");
  positive(double(scale_up_devices), "scale_up_devices");
  if (interconnect == Interconnect::torus) positive(double(links_per_device), "links_per_device");
}

std::vector<std::string> hardware_preset_names() { return {"tpu-v5p", "tpu-v7x", "h100", "h200", "b200"}; }

HardwareSpec load_hardware(const std::string& key, const std::string& name_or_path) {
  if (name_or_path == "tpu-v5p") return tpu_v5p();
  if (name_or_path == "tpu-v7x") return tpu_v7x();
  // NVIDIA datasheets: H100 SXM 80 GB, 989 TFLOP/s bf16 dense, NVLink 900 GB/s;
  // H200 SXM 141 GB, same compute and NVLink; DGX B200: 1440 GB over 8 GPUs,
  // 2250 TFLOP/s bf16 dense (HGX B200), NVLink 5 1.8 TB/s. ConnectX-7 400 Gbit/s.
  // HBM bandwidth: H100 SXM 3.35 TB/s, H200 4.8 TB/s, B200 8 TB/s.
  if (name_or_path == "h100") return nvidia("h100", 80, 3.35, 989, 900, 400);
  if (name_or_path == "h200") return nvidia("h200", 141, 4.8, 989, 900, 400);
  if (name_or_path == "b200") return nvidia("b200", 180, 8.0, 2250, 1800, 400);
  const std::filesystem::path path(name_or_path);
  if (!std::filesystem::exists(path)) {
    std::string names;
    for (const std::string& n : hardware_preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw ConfigError(key + "=" + name_or_path + ": neither a hardware preset (" + names +
                      ") nor an existing YAML file (e.g. configs/hardware/tpu-v7x.yaml)");
  }
  HardwareSpec hw;
  hw.name = path.stem().string();
  auto scaled = [](double& field, double unit) {
    return [&field, unit](const std::string& text) { field = parse_positive(text) * unit; };
  };
  // Rates far below any device's: the modelled clock would run past its
  // range on them (core/modelled_clock.h), and plan's times would be absurd.
  auto rate = [](double& field, double unit, double min_value) {
    return [&field, unit, min_value](const std::string& text) { field = parse_at_least(text, min_value) * unit; };
  };
  auto count = [](std::int64_t& field) { return [&field](const std::string& text) { field = parse_count(text, 1); }; };
  read_spec_file(
      path, "hardware",
      {{"name", false, "a word", [&hw](const std::string& t) { hw.name = t; }},
       {"devices_per_chip", false, "an integer >= 1 (informational: the other fields are per device)",
        count(hw.devices_per_chip)},
       {"memory_gb", true, "a number > 0 (1e9 bytes)", scaled(hw.memory_bytes, kGB)},
       {"memory_gb_per_s", false, "a number >= 0.001 (HBM bandwidth; needed by clock=modelled)",
        rate(hw.memory_bytes_per_s, kGB, 1e-3)},
       {"peak_bf16_tflops", true, "a number >= 1e-06", rate(hw.peak_bf16_flops, kTera, 1e-6)},
       {"peak_fp8_tflops", true, "a number >= 1e-06", rate(hw.peak_fp8_flops, kTera, 1e-6)},
       {"interconnect", true, "torus or switched",
        [&hw](const std::string& t) {
          if (t != "torus" && t != "switched") throw std::invalid_argument(t);
          hw.interconnect = t == "torus" ? Interconnect::torus : Interconnect::switched;
        }},
       {"scale_up_devices", true, "an integer >= 1", count(hw.scale_up_devices)},
       {"link_gb_per_s", true, "a number >= 1e-06 (one direction)", rate(hw.link_bytes_per_s, kGB, 1e-6)},
       {"links_per_device", false, "an integer >= 1", count(hw.links_per_device)},
       {"scale_out_gb_per_s", true, "a number >= 1e-06 (one direction)", rate(hw.scale_out_bytes_per_s, kGB, 1e-6)}});
  hw.validate(key + "=" + name_or_path);
  return hw;
}

}  // namespace epmoe::hardware
