#include "plan/communication_model.h"

#include "core/error.h"

namespace epmoe::plan {

std::string to_string(DispatchKind kind) { return kind == DispatchKind::ring ? "ring" : "alltoall"; }

double probability_rank_hit(std::int64_t num_experts, std::int64_t experts_per_rank, std::int64_t top_k) {
  EPMOE_CHECK(top_k >= 1 && top_k <= num_experts && experts_per_rank >= 1 && experts_per_rank <= num_experts);
  // C(E - E_l, K) / C(E, K) = prod_{i<K} (E - E_l - i) / (E - i): the chance
  // that all K draws without replacement miss the rank's E_l experts.
  double miss = 1.0;
  for (std::int64_t i = 0; i < top_k; ++i) {
    const double outside = double(num_experts - experts_per_rank - i);
    if (outside <= 0) return 1.0;
    miss *= outside / double(num_experts - i);
  }
  return 1.0 - miss;
}

AllToAllTraffic expected_alltoall_traffic(const DispatchShape& s, bool dedup) {
  const double r = double(s.num_ranks);
  AllToAllTraffic t;
  t.dedup = dedup;
  t.pairs_sent = s.tokens_per_rank * double(s.top_k) * (r - 1) / r;
  t.rows_sent = dedup ? s.tokens_per_rank * (r - 1) * probability_rank_hit(s.num_experts, s.experts_per_rank(), s.top_k)
                      : t.pairs_sent;
  t.rows_received = t.rows_sent;
  t.pairs_received = t.pairs_sent;
  return t;
}

namespace {

// The control streams either dispatcher adds when configured, after its own.
// The counts round carries E integers per rank, and extra_counts more (what
// prices the all-to-all's token rows; ep::ReplicaExchange::plan_step).
void add_configured_streams(const DispatchShape& s, std::int64_t extra_counts, std::vector<CollectiveBytes>& out) {
  const double others = double(s.num_ranks - 1);
  if (s.fp8_tensor_scale) out.push_back({"forward/ring_all_gather fp8 scale", others * double(s.num_chunks) * 4});
  if (s.replicas)
    out.push_back({"forward/ring_all_gather replica counts", others * double(s.num_experts + extra_counts) * 8});
}

}  // namespace

std::vector<CollectiveBytes> ring_collective_bytes(const DispatchShape& s, bool remat_x_sorted) {
  const double others = double(s.num_ranks - 1) * s.tokens_per_rank;  // token rows from the other ranks
  const double h = double(s.hidden), k = double(s.top_k), a = s.activation_bytes;
  std::vector<CollectiveBytes> out = {
      {"forward/ring_all_gather tokens", others * s.token_row_bytes},
      {"forward/ring_all_gather routing", others * 2 * k * 4},
      {"forward/reduce_scatter combine", others * h * a},
      {"backward/ring_all_gather cotangent", others * h * a},
      {"backward/reduce_scatter dx", others * h * a},
      {"backward/reduce_scatter dweights", others * k * 4},
  };
  if (remat_x_sorted) {
    out.push_back({"backward/remat ring_all_gather tokens", out[0].bytes});
    out.push_back({"backward/remat ring_all_gather routing", out[1].bytes});
  }
  out.push_back({"forward/ring token counts", double(s.num_ranks - 1) * 8});
  add_configured_streams(s, 0, out);  // the ring's price has no token rows
  return out;
}

std::vector<CollectiveBytes> alltoall_collective_bytes(const DispatchShape& s, const AllToAllTraffic& t,
                                                       bool remat_x_sorted) {
  const double h = double(s.hidden), a = s.activation_bytes;
  std::vector<CollectiveBytes> out = {
      {"forward/all_to_all_v tokens", t.rows_sent * s.token_row_bytes},
      {"forward/all_to_all_v routing", 4 * (t.rows_sent + 2 * t.pairs_sent)},
      {"forward/all_to_all_v combine", t.rows_received * h * a},
      {"backward/all_to_all_v cotangent", t.rows_sent * h * a},
      {"backward/all_to_all_v dx", t.rows_received * h * a},
      {"backward/all_to_all_v dweights", t.pairs_received * 4},
  };
  if (remat_x_sorted) {
    out.push_back({"backward/remat all_to_all_v tokens", out[0].bytes});
    out.push_back({"backward/remat all_to_all_v routing", out[1].bytes});
  }
  out.push_back({"forward/all_to_all_v counts", double(s.num_ranks - 1) * 8 * double(s.num_chunks)});
  // Priced: each rank's pair total, and with dedup its rows per destination.
  add_configured_streams(s, s.replicas_priced ? 1 + (t.dedup ? s.num_ranks : 0) : 0, out);
  return out;
}

double total_bytes(const std::vector<CollectiveBytes>& collectives) {
  double sum = 0;
  for (const CollectiveBytes& c : collectives) sum += c.bytes;
  return sum;
}

double token_bytes(const std::vector<CollectiveBytes>& collectives) {
  double sum = 0;
  for (const CollectiveBytes& c : collectives)
    if (c.name.ends_with(" tokens")) sum += c.bytes;
  return sum;
}

}  // namespace epmoe::plan
