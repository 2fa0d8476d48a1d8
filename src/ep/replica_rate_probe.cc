#include "ep/replica_rate_probe.h"

#include <algorithm>
#include <array>
#include <vector>

#include "comm/all_gather.h"
#include "comm/tag.h"
#include "core/error.h"
#include "ep/collective_tags.h"
#include "kernels/gemm.h"

namespace epmoe::ep {

namespace {

constexpr int kRepetitions = 3;      // after one warm-up; the median counts
constexpr std::int64_t kRows = 256;  // rows of the probe's product
constexpr std::int64_t kSmallMessage = 8;

using Seconds = std::chrono::duration<double>;

// The median, not the fastest: ranks that share cores (threads) measure at
// once, and what a step sees is their typical share, not a quiet moment.
double median_seconds(const auto& run) {
  run();  // warm-up: first-touch pages, the library's kernel creation
  std::array<double, kRepetitions> seconds{};
  for (double& s : seconds) {
    const auto start = std::chrono::steady_clock::now();
    run();
    s = Seconds(std::chrono::steady_clock::now() - start).count();
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[kRepetitions / 2];
}

double compute_flops_per_s(const ReplicaProbeShape& shape) {
  const std::int64_t h = shape.hidden, f = shape.ffn;
  // b 16 bytes off the 32-byte grid, where the layer's f32 products run
  // theirs (kernels/gemm.h, b_version), without a cache entry keyed by a
  // pointer that dies here.
  std::vector<float> a(static_cast<std::size_t>(kRows * h), 0.5f),
      b_storage(static_cast<std::size_t>(h * f + 8), 0.25f), c(static_cast<std::size_t>(kRows * f));
  float* b = b_storage.data();
  while (reinterpret_cast<std::uintptr_t>(b) % 32 != 16) ++b;
  const double seconds = median_seconds([&] {
    gemm({.a = a.data(), .b = b, .c = c.data(), .m = kRows, .n = f, .k = h, .compute_dtype = shape.compute_dtype});
  });
  return 2.0 * static_cast<double>(kRows * h * f) / std::max(seconds, 1e-9);
}

}  // namespace

ReplicaCostRates agreed_replica_rates(std::span<const ReplicaRateProbe> probes) {
  EPMOE_CHECK(!probes.empty());
  ReplicaCostRates rates{.compute_flops_per_s = probes[0].compute_flops_per_s,
                         .link_bytes_per_s = probes[0].link_bytes_per_s,
                         .link_latency_s = probes[0].link_latency_s,
                         .measure = true};
  for (const ReplicaRateProbe& p : probes) {
    rates.compute_flops_per_s = std::min(rates.compute_flops_per_s, p.compute_flops_per_s);
    rates.link_bytes_per_s = std::min(rates.link_bytes_per_s, p.link_bytes_per_s);
    rates.link_latency_s = std::max(rates.link_latency_s, p.link_latency_s);
  }
  return rates;
}

ReplicaCostRates measure_replica_rates(transport::Communicator& comm, const ReplicaProbeShape& shape,
                                       std::uint32_t tag_base, std::chrono::milliseconds timeout,
                                       std::int64_t& bytes_sent) {
  const int num_ranks = comm.size();
  if (num_ranks == 1) return {.measure = true};
  EPMOE_CHECK(shape.hidden > 0 && shape.ffn > 0);
  ReplicaRateProbe mine;
  mine.compute_flops_per_s = compute_flops_per_s(shape);

  // A ring shift: send to the next rank, receive from the previous one, as a
  // replica's weights go from its home to one receiver.
  const int next = (comm.rank() + 1) % num_ranks, previous = (comm.rank() + num_ranks - 1) % num_ranks;
  const std::int64_t weight_bytes = 3 * shape.hidden * shape.ffn * shape.weight_element_bytes;
  std::vector<char> outgoing(static_cast<std::size_t>(weight_bytes), 1), incoming(outgoing.size());
  const auto shift = [&](std::int64_t num_bytes, int chunk) {
    const transport::Tag tag = comm::make_tag(comm::CollectiveKind::point_to_point,
                                              ep_tag(tag_base, chunk, EpOp::replica_rate_probe), comm::Slot::data);
    const auto receive = comm.irecv(previous, tag, incoming.data(), num_bytes);
    const auto send = comm.isend(next, tag, outgoing.data(), num_bytes);
    const transport::Deadline deadline = transport::Clock::now() + timeout;
    send->wait_until(deadline);
    receive->wait_until(deadline);
    bytes_sent += num_bytes;
  };
  mine.link_latency_s = median_seconds([&] { shift(kSmallMessage, 0); });
  const double large = median_seconds([&] { shift(weight_bytes, 1); });
  // Noise can make the large message no slower than the small one: then its
  // own time is the bound on its bandwidth.
  const double transfer = large > mine.link_latency_s ? large - mine.link_latency_s : large;
  mine.link_bytes_per_s = static_cast<double>(weight_bytes) / std::max(transfer, 1e-12);

  std::vector<ReplicaRateProbe> all(static_cast<std::size_t>(num_ranks));
  static_assert(sizeof(ReplicaRateProbe) == 3 * sizeof(std::int64_t));
  comm::ring_all_gather(comm, {.input = &mine,
                               .output = all.data(),
                               .num_elements_per_rank = 3,
                               .dtype = DType::i64,  // moved as bytes: three doubles
                               .tag = ep_tag(tag_base, 2, EpOp::replica_rate_probe),
                               .timeout = timeout})
      .wait();
  bytes_sent += static_cast<std::int64_t>(sizeof(ReplicaRateProbe)) * (num_ranks - 1);
  return agreed_replica_rates(all);
}

}  // namespace epmoe::ep
