// The link model of the threads transport: which links a message from rank a
// to rank b crosses, at what bandwidth and latency, and the schedule that
// serialises messages on each link direction. Two clocks use it:
//  * wall (EmulatedLinks, below): EMULATION, not measurement of real
//    hardware. Each message is given a modelled arrival time in real time and
//    its receiver (and its sender, for the serialisation part) sleeps until
//    then, so that algorithm choices and overlap can be studied at link
//    speeds below this machine's memcpy (~55 GB/s, DESIGN.md §7). Messages
//    take the links in the order they are posted in real time.
//  * modelled (VirtualTimeline, threads/virtual_timeline.h): the same links
//    and schedule on per-rank virtual clocks, taken in virtual-time order.
//
// Model:
//  * links are full duplex: a->b and b->a are independent;
//  * a message of n bytes occupies each link (resource) of a hop for
//    n / bandwidth and reaches the hop's end `latency` after its last byte
//    left; messages on one link are serialised (first come, first served);
//  * store-and-forward: a message crosses its hops in turn, each starting
//    when the whole message has reached the hop's start;
//  * full_mesh: a dedicated link for every ordered pair (one hop);
//  * ring: links between neighbours r and r±1 only; a message to a rank h
//    hops away takes the shorter way (clockwise on ties) over h hops;
//  * switched (NVLink + NVSwitch): one hop through the sender's egress port
//    and the receiver's ingress port, cut-through with buffering in the
//    switch: the egress port serialises the rank's sends (they share its
//    injection bandwidth) and is free again when the last byte left; the
//    ingress port takes the bytes as they come, once it is free, so the
//    last byte arrives when both ports have passed it (plus latency). A busy
//    receiver delays the arrival, not the sender's next message;
//  * two_level: ranks in groups of group_size; inside a group as switched,
//    between groups one hop over the sender's and the receiver's scale-out
//    ports (NICs) at scale_out_bandwidth and scale_out_latency.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "core/modelled_clock.h"
#include "hardware/link_options.h"
#include "transport/communicator.h"

namespace epmoe::transport::threads {

// The links' options live below transport/ (hardware/link_options.h), where a
// hardware preset is turned into them.
using hardware::EmulatedLinkOptions;
using hardware::link_topology_name;
using hardware::LinkTopology;
using hardware::parse_link_topology;

// One hop of a message's path: one link, or (switched) an egress then an
// ingress port, the second taking the bytes as the first passes them.
struct LinkHop {
  std::array<int, 2> resources{};
  int num_resources = 0;
  double bytes_per_second = 0;
  Picoseconds latency = 0;

  // ConfigError when beyond the clock's range (core/modelled_clock.h).
  Picoseconds serialise(std::int64_t num_bytes) const {
    return seconds_to_picoseconds(static_cast<double>(num_bytes) / bytes_per_second,
                                  "the time a message takes to cross a link (its bytes / the link's bandwidth)");
  }
};

class LinkPaths {
 public:
  LinkPaths(int num_ranks, const EmulatedLinkOptions& options);
  std::vector<LinkHop> path(int src, int dst) const;  // empty when src == dst
  int hops(int src, int dst) const { return static_cast<int>(path(src, dst).size()); }
  int num_resources() const { return num_resources_; }

 private:
  int num_ranks_;
  EmulatedLinkOptions options_;
  int num_resources_;
};

// Busy-until time of every link; not thread-safe (callers lock).
class LinkSchedule {
 public:
  explicit LinkSchedule(int num_resources)
      : busy_until_(static_cast<std::size_t>(num_resources), std::numeric_limits<Picoseconds>::min()) {}
  // Takes `hop` for `num_bytes` from `ready` on (or when its links are free);
  // returns when the last byte left (`pushed_out`) and when it arrived at the
  // hop's end (the return value).
  Picoseconds take(const LinkHop& hop, std::int64_t num_bytes, Picoseconds ready, Picoseconds* pushed_out);
  // One link of a hop: busy from max(ready, free) for `serialise`, and not
  // done before `not_before` (the bytes of a cut-through port cannot pass
  // before they arrived). Returns when its last byte passed; ConfigError
  // when that is beyond the clock's range.
  Picoseconds take_link(int resource, Picoseconds ready, Picoseconds serialise, Picoseconds not_before);
  static constexpr Picoseconds kNoBound = std::numeric_limits<Picoseconds>::min();  // for not_before

 private:
  std::vector<Picoseconds> busy_until_;
};

// When a message posted now is off the sender's hands and when it arrives.
struct LinkTiming {
  Clock::time_point send_done;  // the first link has pushed the last byte out
  Clock::time_point arrival;    // the last byte is at the receiver
};

// The wall-clock emulation (above).
class EmulatedLinks {
 public:
  EmulatedLinks(int num_ranks, const EmulatedLinkOptions& options);

  bool enabled() const { return options_.enabled; }
  // Reserves the links from src to dst for a message of num_bytes posted at
  // `posted`. Thread-safe.
  LinkTiming reserve(int src, int dst, std::int64_t num_bytes, Clock::time_point posted);
  int hops(int src, int dst) const { return paths_.hops(src, dst); }

 private:
  EmulatedLinkOptions options_;
  LinkPaths paths_;
  Clock::time_point origin_;
  std::mutex mutex_;  // guards schedule_
  LinkSchedule schedule_;
};

}  // namespace epmoe::transport::threads
