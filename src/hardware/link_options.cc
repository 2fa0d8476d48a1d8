#include "hardware/link_options.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace epmoe::hardware {
namespace {

void require_bandwidth(double value, const char* key) {
  if (!(value >= kMinBandwidthGbPerS) || !std::isfinite(value)) {
    std::ostringstream msg;
    msg << key << " = " << value << ": must be a finite number >= " << kMinBandwidthGbPerS
        << " (GB/s, i.e. 1 kB/s; a message's modelled time soon passes the clock's range below it)";
    throw ConfigError(msg.str());
  }
}

void require_latency(double value, const char* key) {
  if (!(value >= 0.0 && value <= kMaxLatencyUs)) {
    std::ostringstream msg;
    msg << key << " = " << value << ": must be in [0, " << kMaxLatencyUs
        << "] (microseconds: at most a second per hop)";
    throw ConfigError(msg.str());
  }
}

}  // namespace

void EmulatedLinkOptions::validate() const {
  // The keys of `epmoe layer` / `train` (or the hardware file's fields, which
  // hardware.cc bounds the same way before they get here).
  require_bandwidth(bandwidth_gb_per_s, "link_bandwidth_gbps");
  require_latency(latency_us, "link_latency_us");
  if (topology == LinkTopology::two_level) {
    if (group_size < 1) {
      throw ConfigError("links.group_size = " + std::to_string(group_size) + ": must be >= 1");
    }
    require_bandwidth(scale_out_bandwidth_gb_per_s,
                      "links.scale_out_bandwidth_gb_per_s (the hardware's scale_out_gb_per_s)");
    require_latency(scale_out_latency_us, "links.scale_out_latency_us");
  }
}

std::string link_topology_name(LinkTopology topology) {
  switch (topology) {
    case LinkTopology::full_mesh:
      return "full_mesh";
    case LinkTopology::ring:
      return "ring";
    case LinkTopology::switched:
      return "switched";
    case LinkTopology::two_level:
      return "two_level";
  }
  return "?";
}

LinkTopology parse_link_topology(const std::string& key, const std::string& name) {
  for (LinkTopology t :
       {LinkTopology::full_mesh, LinkTopology::ring, LinkTopology::switched, LinkTopology::two_level}) {
    if (name == link_topology_name(t)) return t;
  }
  throw ConfigError(key + "=" + name + ": not a link topology (full_mesh, ring, switched, two_level)");
}

}  // namespace epmoe::hardware
