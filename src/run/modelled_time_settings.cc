#include "run/modelled_time_settings.h"

#include "core/error.h"
#include "hardware/hardware.h"
#include "hardware/modelled_clock_options.h"

namespace epmoe::run {
namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

KeyGroup modelled_time_keys() {
  return {
      "modelled time and trace (DESIGN.md 4.11)",
      {
          {.name = "clock",
           .type = KeyType::choice,
           .default_value = "wall",
           .help = "wall: time as this machine runs it; modelled: every rank on its own virtual clock, "
                   "compute at the hardware's rates and messages at its links' (transport=threads)",
           .choices = {"wall", "modelled"}},
          {.name = "hardware",
           .type = KeyType::text,
           .default_value = "h100",
           .help = "clock=modelled: the device and links, a preset (" + join(hardware::hardware_preset_names()) +
                   ") or a YAML file (configs/hardware/); link_* keys override its links"},
          {.name = "compute_time",
           .type = KeyType::choice,
           .default_value = "modelled",
           .help = "clock=modelled: modelled = FLOPs at the device's bf16 peak x compute_efficiency, memory-bound "
                   "steps at its memory bandwidth (deterministic); measured = each operation's thread CPU time "
                   "here x compute_scale",
           .choices = {"modelled", "measured"}},
          {.name = "compute_efficiency",
           .type = KeyType::real,
           .default_value = "0.5",
           .help = "compute_time=modelled: the fraction of peak FLOP/s a matmul reaches",
           .min_value = 0,
           .min_exclusive = true,
           .max_value = 1},
          {.name = "compute_scale",
           .type = KeyType::real,
           .default_value = "1",
           .help = "compute_time=measured: multiplies the measured CPU seconds (this host vs the device)",
           .min_value = 0,
           .min_exclusive = true},
          {.name = "trace_file",
           .type = KeyType::text,
           .default_value = "",
           .help = "write a Chrome trace (Perfetto UI, chrome://tracing) of every rank's phases, compute and "
                   "collectives to this path, in the run's clock; empty = none"},
      },
  };
}

void check_modelled_time_transport(const ConfigValues& values) {
  if (values.get_string("transport") != "mpi") return;
  if (!values.get_string("trace_file").empty()) {
    throw ConfigError(values.setting("trace_file") +
                      ": transport=threads only (an mpi rank cannot see the "
                      "other processes' events); run the same config with transport=threads to trace it");
  }
  if (values.get_string("clock") == "modelled") {
    throw ConfigError(
        "clock=modelled: needs transport=threads (the virtual timeline orders every rank's "
        "messages in one address space); transport=mpi runs on the wall clock");
  }
}

void configure_modelled_time(const ConfigValues& values, ExpertParallelSettings& settings) {
  check_modelled_time_transport(values);
  settings.trace_file = values.get_string("trace_file");
  transport::threads::ModelledTimeOptions& modelled = settings.modelled;
  modelled.enabled = values.get_string("clock") == "modelled";
  if (!modelled.enabled) {
    for (const char* key : {"hardware", "compute_time", "compute_efficiency", "compute_scale"}) {
      if (values.is_set(key)) {
        throw ConfigError(values.setting(key) + ": applies to clock=modelled only (clock=wall)");
      }
    }
    return;
  }
  if (values.is_set("link_bandwidth_gbps") && values.get_float("link_bandwidth_gbps") <= 0) {
    throw ConfigError(values.setting("link_bandwidth_gbps") +
                      ": with clock=modelled it overrides the hardware's link bandwidth and must be > 0");
  }
  const hardware::HardwareSpec device = hardware::load_hardware("hardware", values.get_string("hardware"));
  settings.hardware = device.name;
  if (values.get_string("compute_time") == "modelled" && !(device.memory_bytes_per_s > 0)) {
    throw ConfigError("hardware=" + values.get_string("hardware") +
                      ": compute_time=modelled needs memory_gb_per_s (the device's memory bandwidth)");
  }
  // The device's rates and links, then the keys that were given. The
  // wall-clock emulation stays off (the modelled clock uses the links itself).
  const hardware::ModelledClockOptions options = hardware::modelled_clock_options(device, settings.num_ranks);
  modelled = options.time;
  modelled.measured_compute = values.get_string("compute_time") == "measured";
  modelled.compute_efficiency = values.get_float("compute_efficiency");
  modelled.compute_scale = values.get_float("compute_scale");
  transport::threads::EmulatedLinkOptions& links = settings.links;
  links = options.links;
  if (values.is_set("link_bandwidth_gbps")) links.bandwidth_gb_per_s = values.get_float("link_bandwidth_gbps");
  if (values.is_set("link_topology")) {
    links.topology = transport::threads::parse_link_topology("link_topology", values.get_string("link_topology"));
  }
  links.latency_us = values.get_float("link_latency_us");
  links.validate();
  modelled.validate();
}

}  // namespace epmoe::run
