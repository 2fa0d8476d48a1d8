#include "transport/threads/emulated_links.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace epmoe::transport::threads {

void EmulatedLinkOptions::validate() const {
  if (!enabled) return;
  if (!(bandwidth_gb_per_s > 0.0) || !std::isfinite(bandwidth_gb_per_s)) {
    std::ostringstream msg;
    msg << "links.bandwidth_gb_per_s = " << bandwidth_gb_per_s << ": must be a finite number > 0";
    throw ConfigError(msg.str());
  }
  if (!(latency_us >= 0.0) || !std::isfinite(latency_us)) {
    std::ostringstream msg;
    msg << "links.latency_us = " << latency_us << ": must be a finite number >= 0";
    throw ConfigError(msg.str());
  }
}

std::string link_topology_name(LinkTopology topology) {
  return topology == LinkTopology::ring ? "ring" : "full_mesh";
}

EmulatedLinks::EmulatedLinks(int num_ranks, const EmulatedLinkOptions& options)
    : num_ranks_(num_ranks),
      options_(options),
      busy_until_(static_cast<std::size_t>(num_ranks) * num_ranks, Clock::time_point{}) {
  options_.validate();
}

Clock::duration EmulatedLinks::transfer_time(std::int64_t num_bytes) const {
  const double seconds = static_cast<double>(num_bytes) / (options_.bandwidth_gb_per_s * 1e9);
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

EmulatedLinks::Route EmulatedLinks::route(int src, int dst) const {
  if (options_.topology == LinkTopology::full_mesh || src == dst) return {src == dst ? 0 : 1, 0};
  const int forward = ((dst - src) % num_ranks_ + num_ranks_) % num_ranks_;
  const int backward = num_ranks_ - forward;
  return forward <= backward ? Route{forward, 1} : Route{backward, -1};  // ties go clockwise
}

int EmulatedLinks::hops(int src, int dst) const { return route(src, dst).num_hops; }

LinkTiming EmulatedLinks::reserve(int src, int dst, std::int64_t num_bytes,
                                  Clock::time_point posted) {
  if (!options_.enabled) return {posted, posted};
  const auto latency = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::micro>(options_.latency_us));
  const auto serialise = transfer_time(num_bytes);

  const Route path = route(src, dst);
  std::lock_guard<std::mutex> lock(mutex_);
  LinkTiming timing{posted, posted};
  Clock::time_point ready = posted;  // when the whole message is at the current hop's start
  int at = src;
  for (int hop = 0; hop < path.num_hops; ++hop) {
    const int next = path.step == 0 ? dst : ((at + path.step) % num_ranks_ + num_ranks_) % num_ranks_;
    Clock::time_point& busy = busy_until_[link_index(at, next)];
    const Clock::time_point start = std::max(ready, busy);
    busy = start + serialise;
    if (hop == 0) timing.send_done = busy;
    ready = busy + latency;  // store-and-forward: the next hop starts when all bytes arrived
    at = next;
  }
  timing.arrival = ready;
  return timing;
}

}  // namespace epmoe::transport::threads
