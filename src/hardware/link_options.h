// The links ranks reach each other over, as the threads transport runs them
// on either clock (the model: transport/threads/emulated_links.h). Kept here,
// below transport/, so that a hardware preset can be turned into them once
// (hardware/modelled_clock_options.h); transport::threads re-exports them.
#pragma once

#include <string>

namespace epmoe::hardware {

enum class LinkTopology { full_mesh, ring, switched, two_level };

struct EmulatedLinkOptions {
  bool enabled = false;              // wall clock only; clock=modelled always uses the links
  double bandwidth_gb_per_s = 50.0;  // 1 GB = 1e9 bytes; per link and direction (per port: switched)
  double latency_us = 2.0;
  LinkTopology topology = LinkTopology::full_mesh;
  int group_size = 8;                          // two_level
  double scale_out_bandwidth_gb_per_s = 50.0;  // two_level, per port and direction
  double scale_out_latency_us = 5.0;           // two_level

  // Throws ConfigError naming the key: bandwidths at least
  // kMinBandwidthGbPerS, latencies at most kMaxLatencyUs (beyond them no
  // link is meant, and a message's modelled time soon passes the clock's
  // range, core/modelled_clock.h).
  void validate() const;
};

constexpr double kMinBandwidthGbPerS = 1e-6;  // 1 kB/s
constexpr double kMaxLatencyUs = 1e6;         // one second per hop

std::string link_topology_name(LinkTopology topology);
// ConfigError naming `key` and the accepted names.
LinkTopology parse_link_topology(const std::string& key, const std::string& name);

}  // namespace epmoe::hardware
