#include "transport/threads/emulated_links.h"

#include <algorithm>
#include <string_view>

#include "core/error.h"

namespace epmoe::transport::threads {
namespace {

Picoseconds microseconds(double us, std::string_view what) { return seconds_to_picoseconds(us * 1e-6, what); }

}  // namespace

// Resources: [0, R*R) one link per ordered pair (full_mesh, ring
// neighbours); then per rank its switch egress and ingress ports and its
// scale-out egress and ingress ports.
LinkPaths::LinkPaths(int num_ranks, const EmulatedLinkOptions& options)
    : num_ranks_(num_ranks), options_(options), num_resources_(num_ranks * num_ranks + 4 * num_ranks) {}

std::vector<LinkHop> LinkPaths::path(int src, int dst) const {
  std::vector<LinkHop> hops;
  if (src == dst) return hops;
  const int R = num_ranks_;
  const double bandwidth = options_.bandwidth_gb_per_s * 1e9;
  const Picoseconds latency = microseconds(options_.latency_us, "the link latency (link_latency_us)");
  auto pair_link = [&](int a, int b) {
    LinkHop hop{{a * R + b, 0}, 1, bandwidth, latency};
    return hop;
  };
  auto ports = [&](int egress_base, int ingress_base, double bytes_per_second, Picoseconds hop_latency) {
    LinkHop hop{{R * R + egress_base * R + src, R * R + ingress_base * R + dst}, 2, bytes_per_second, hop_latency};
    return hop;
  };
  switch (options_.topology) {
    case LinkTopology::full_mesh:
      hops.push_back(pair_link(src, dst));
      break;
    case LinkTopology::ring: {
      const int forward = ((dst - src) % R + R) % R;
      const int backward = R - forward;
      const int step = forward <= backward ? 1 : -1;  // ties go clockwise
      const int count = std::min(forward, backward);
      int at = src;
      for (int h = 0; h < count; ++h) {
        const int next = ((at + step) % R + R) % R;
        hops.push_back(pair_link(at, next));
        at = next;
      }
      break;
    }
    case LinkTopology::switched:
      hops.push_back(ports(0, 1, bandwidth, latency));
      break;
    case LinkTopology::two_level:
      if (src / options_.group_size == dst / options_.group_size) {
        hops.push_back(ports(0, 1, bandwidth, latency));
      } else {
        hops.push_back(
            ports(2, 3, options_.scale_out_bandwidth_gb_per_s * 1e9,
                  microseconds(options_.scale_out_latency_us, "the scale-out latency (links.scale_out_latency_us)")));
      }
      break;
  }
  return hops;
}

Picoseconds LinkSchedule::take_link(int resource, Picoseconds ready, Picoseconds serialise, Picoseconds not_before) {
  Picoseconds& busy = busy_until_[static_cast<std::size_t>(resource)];
  busy = std::max(add_picoseconds(std::max(ready, busy), serialise, "the time a link is busy until"), not_before);
  return busy;
}

Picoseconds LinkSchedule::take(const LinkHop& hop, std::int64_t num_bytes, Picoseconds ready, Picoseconds* pushed_out) {
  const Picoseconds serialise = hop.serialise(num_bytes);
  // The first link (or egress port) sends as soon as it is free; an ingress
  // port after it starts no earlier than the bytes do and no earlier than it
  // is free, and its last byte cannot pass before the egress's.
  const Picoseconds egress_done = take_link(hop.resources[0], ready, serialise, kNoBound);
  if (pushed_out != nullptr) *pushed_out = egress_done;
  Picoseconds done = egress_done;
  for (int i = 1; i < hop.num_resources; ++i)
    done = take_link(hop.resources[i], egress_done - serialise, serialise, done);
  return add_picoseconds(done, hop.latency, "the arrival time of a message");
}

EmulatedLinks::EmulatedLinks(int num_ranks, const EmulatedLinkOptions& options)
    : options_(options), paths_(num_ranks, options), origin_(Clock::now()), schedule_(paths_.num_resources()) {
  if (options_.enabled) options_.validate();
}

LinkTiming EmulatedLinks::reserve(int src, int dst, std::int64_t num_bytes, Clock::time_point posted) {
  if (!options_.enabled) return {posted, posted};
  // Picoseconds from origin_ (negative before it), exact to the nanosecond.
  auto to_time = [&](Picoseconds t) {
    return origin_ + std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(t / 1000));
  };
  const std::vector<LinkHop> hops = paths_.path(src, dst);
  std::lock_guard<std::mutex> lock(mutex_);
  Picoseconds ready = std::chrono::duration_cast<std::chrono::nanoseconds>(posted - origin_).count() * 1000;
  Picoseconds send_done = ready;
  for (std::size_t h = 0; h < hops.size(); ++h) {
    Picoseconds pushed_out = 0;
    ready = schedule_.take(hops[h], num_bytes, ready, &pushed_out);
    if (h == 0) send_done = pushed_out;
  }
  if (hops.empty()) return {posted, posted};
  return {to_time(send_done), to_time(ready)};
}

}  // namespace epmoe::transport::threads
