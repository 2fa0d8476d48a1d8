// Emulated links for the threads transport: EMULATION, not measurement of real
// hardware. Ranks that are threads of one process exchange messages through
// memory at tens of GB/s; to study algorithm choices and compute/communication
// overlap as they would behave on ICI / NVLink / network links, each message is
// given a modelled arrival time and its receiver (and its sender, for the
// serialisation part) waits until then - sleeping, not spinning, so the cores
// stay free for the ranks' compute.
//
// Model:
//  * a directed link per (a, b) pair that exists in the topology; full duplex,
//    i.e. a->b and b->a are independent links;
//  * a message of n bytes occupies a link for n / bandwidth and arrives
//    latency later; messages on one link are serialised in posting order
//    (a link is busy until its previous message has been pushed out);
//  * full_mesh: one link between every pair;
//  * ring: links only between neighbours r and r±1; a message to a rank h hops
//    away travels the shorter way (clockwise on ties) store-and-forward, paying
//    latency + n / bandwidth on each of the h links in turn.
// The memcpy that actually moves the bytes is not part of the model (it runs
// at ~55 GB/s here, DESIGN.md §7, well above the emulated bandwidths).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "transport/communicator.h"

namespace epmoe::transport::threads {

enum class LinkTopology { full_mesh, ring };

struct EmulatedLinkOptions {
  bool enabled = false;
  double bandwidth_gb_per_s = 50.0;  // 1 GB = 1e9 bytes; per link and direction
  double latency_us = 2.0;
  LinkTopology topology = LinkTopology::full_mesh;

  void validate() const;  // throws ConfigError
};

// When a message posted now is off the sender's hands and when it arrives.
struct LinkTiming {
  Clock::time_point send_done;  // the first link has pushed the last byte out
  Clock::time_point arrival;    // the last byte is at the receiver
};

class EmulatedLinks {
 public:
  EmulatedLinks(int num_ranks, const EmulatedLinkOptions& options);

  bool enabled() const { return options_.enabled; }
  // Reserves the links from src to dst for a message of num_bytes posted at
  // `posted`. Thread-safe.
  LinkTiming reserve(int src, int dst, std::int64_t num_bytes, Clock::time_point posted);
  // Hops a message from src to dst crosses (1 on a full mesh).
  int hops(int src, int dst) const;

 private:
  struct Route {
    int num_hops;
    int step;  // +1 clockwise, -1 counter-clockwise, 0 direct (full mesh)
  };
  Route route(int src, int dst) const;
  Clock::duration transfer_time(std::int64_t num_bytes) const;
  std::size_t link_index(int src, int dst) const { return static_cast<std::size_t>(src) * num_ranks_ + dst; }

  int num_ranks_;
  EmulatedLinkOptions options_;
  std::mutex mutex_;                               // guards busy_until_
  std::vector<Clock::time_point> busy_until_;      // [src * R + dst]
};

std::string link_topology_name(LinkTopology topology);

}  // namespace epmoe::transport::threads
