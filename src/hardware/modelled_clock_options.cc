#include "hardware/modelled_clock_options.h"

namespace epmoe::hardware {

ModelledClockOptions modelled_clock_options(const HardwareSpec& device, int num_ranks) {
  ModelledClockOptions options;
  ModelledTimeOptions& time = options.time;
  time.enabled = true;
  time.measured_compute = false;
  time.peak_flops = device.peak_bf16_flops;
  time.memory_bytes_per_s = device.memory_bytes_per_s;

  EmulatedLinkOptions& links = options.links;
  links.enabled = false;  // the modelled clock uses the links itself
  links.bandwidth_gb_per_s = device.link_bytes_per_s / 1e9;
  if (device.interconnect == Interconnect::torus) {
    links.topology = LinkTopology::ring;
  } else if (num_ranks > device.scale_up_devices) {
    links.topology = LinkTopology::two_level;
    links.group_size = static_cast<int>(device.scale_up_devices);
    links.scale_out_bandwidth_gb_per_s = device.scale_out_bytes_per_s / 1e9;
  } else {
    links.topology = LinkTopology::switched;
  }
  return options;
}

}  // namespace epmoe::hardware
