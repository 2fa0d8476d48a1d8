#include "hardware/link_options.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace epmoe::hardware {
namespace {

void require_positive(double value, const char* key) {
  if (!(value > 0.0) || !std::isfinite(value)) {
    std::ostringstream msg;
    msg << key << " = " << value << ": must be a finite number > 0";
    throw ConfigError(msg.str());
  }
}

void require_non_negative(double value, const char* key) {
  if (!(value >= 0.0) || !std::isfinite(value)) {
    std::ostringstream msg;
    msg << key << " = " << value << ": must be a finite number >= 0";
    throw ConfigError(msg.str());
  }
}

}  // namespace

void EmulatedLinkOptions::validate() const {
  require_positive(bandwidth_gb_per_s, "links.bandwidth_gb_per_s");
  require_non_negative(latency_us, "links.latency_us");
  if (topology == LinkTopology::two_level) {
    if (group_size < 1) {
      throw ConfigError("links.group_size = " + std::to_string(group_size) + ": must be >= 1");
    }
    require_positive(scale_out_bandwidth_gb_per_s, "links.scale_out_bandwidth_gb_per_s");
    require_non_negative(scale_out_latency_us, "links.scale_out_latency_us");
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
