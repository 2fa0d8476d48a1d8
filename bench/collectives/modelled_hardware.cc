#include "modelled_hardware.h"

#include <cstdio>
#include <sstream>

#include "hardware/hardware.h"
#include "hardware/modelled_clock_options.h"

namespace epmoe::bench {

bool modelled_clock(const BenchArgs& args) {
  const auto it = args.values.find("clock");
  return it != args.values.end() && it->second == "modelled";
}

std::vector<std::string> hardware_names(const BenchArgs& args) {
  const auto it = args.values.find("hardware");
  const std::string text = it == args.values.end() ? "all" : it->second;
  if (text == "all") return hardware::hardware_preset_names();
  std::vector<std::string> names;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (!item.empty()) names.push_back(item);
  }
  return names;
}

ModelledHardware modelled_hardware(const std::string& name, int num_ranks, double latency_us, const BenchArgs& args) {
  const hardware::HardwareSpec device = hardware::load_hardware("hardware", name);
  const hardware::ModelledClockOptions options = hardware::modelled_clock_options(device, num_ranks);
  ModelledHardware out;
  out.name = device.name;
  out.peak_flops = device.peak_bf16_flops;
  transport::threads::ThreadsOptions& threads = out.threads;
  threads.compute_threads_per_rank = 1;  // real compute only moves the bytes; time is modelled
  threads.modelled = options.time;
  threads.modelled.compute_efficiency = args.number("compute_efficiency", 0.5);
  threads.links = options.links;
  threads.links.latency_us = latency_us;
  threads.validate();
  return out;
}

std::string describe_links(const transport::threads::EmulatedLinkOptions& links) {
  char text[160];
  if (links.topology == transport::threads::LinkTopology::two_level) {
    std::snprintf(text, sizeof text, "two_level groups of %d at %.0f GB/s, %.1f us; %.1f GB/s, %.1f us between",
                  links.group_size, links.bandwidth_gb_per_s, links.latency_us, links.scale_out_bandwidth_gb_per_s,
                  links.scale_out_latency_us);
  } else {
    std::snprintf(text, sizeof text, "%s %.0f GB/s, %.1f us",
                  transport::threads::link_topology_name(links.topology).c_str(), links.bandwidth_gb_per_s,
                  links.latency_us);
  }
  return text;
}

}  // namespace epmoe::bench
