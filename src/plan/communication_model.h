// Bytes each expert-parallel rank sends per MoE layer, forward + backward, by
// collective, under the names the engine measures them by
// (ep::DispatchStats::bytes_sent), so tests/plan checks the two agree exactly.
//
// Ring of experts (DESIGN.md §4.6), per rank, N_l tokens, R ranks:
//   forward/ring_all_gather tokens          ·N_l·token_row_bytes
//   forward/ring_all_gather routing         ·N_l·2K·4   (ids + weights, not logits)
//   forward/reduce_scatter combine          ·N_l·H·a
//   backward/ring_all_gather cotangent      ·N_l·H·a
//   backward/reduce_scatter dx              ·N_l·H·a
//   backward/reduce_scatter dweights        ·N_l·K·4
//   forward/ring token counts               ·8          (each rank's N_l, one i64 to every peer)
// All-to-all (DESIGN.md §4.5), from the rows and (token, expert) pairs a rank
// sends to / receives from other ranks (a row is one (token, expert) pair, or
// with dedup one (token, destination rank)):
//   forward/all_to_all_v tokens             rows_sent·token_row_bytes
//   forward/all_to_all_v routing            4·(rows_sent + 2·pairs_sent)
//   forward/all_to_all_v combine            rows_received·H·a
//   backward/all_to_all_v cotangent         rows_sent·H·a
//   backward/all_to_all_v dx                rows_received·H·a
//   backward/all_to_all_v dweights          pairs_received·4
//   forward/all_to_all_v counts             ·8·n        (the count round, one i64 per peer and chunk)
// Either dispatcher, when configured:
//   forward/ring_all_gather fp8 scale       ·n·4        (fp8_tokens=tensor: each chunk's absmax, f32)
//   forward/ring_all_gather replica counts  ·c·8        (redundant slots, i64 per rank: c = E pairs per
//                                                             expert; the priced all-to-all adds the rank's pair
//                                                             total, 1, and with dedup its rows per destination, R)
// a = bytes of an activation / gradient element as it travels (f32 in the
// engine, bf16 in MaxText); n = token chunks. Recomputing x_sorted repeats
// the token and routing transfers under "backward/remat ..."; it, the
// combine and the backward know their counts from the forward (no count
// round). The replicas' weights and gradients ("forward/replica weights",
// "backward/replica gradients") depend on where the planner puts replicas
// and are not predicted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epmoe::plan {

enum class DispatchKind { alltoall, ring };

struct DispatchShape {
  std::int64_t num_ranks = 1;     // R
  double tokens_per_rank = 0;     // N_l
  std::int64_t hidden = 0;        // H
  std::int64_t top_k = 0;         // K
  std::int64_t num_experts = 0;   // E
  double token_row_bytes = 0;     // one token as it travels forward (f32, bf16, fp8 + scale)
  double activation_bytes = 4;    // a, above
  std::int64_t num_chunks = 1;    // n, above (token_chunks)
  bool fp8_tensor_scale = false;  // fp8_tokens=tensor: the chunks' maxima are all-gathered
  bool replicas = false;          // redundant slots: the [R, E] expert counts are all-gathered
  bool replicas_priced = false;   // replica_costs=priced: the all-to-all's token rows enter the price, so the
                                  // counts round carries what prices them (above)

  std::int64_t experts_per_rank() const { return num_experts / num_ranks; }
};

// Rows and pairs one rank exchanges with the other ranks (its own excluded).
struct AllToAllTraffic {
  double rows_sent = 0, pairs_sent = 0;
  double rows_received = 0, pairs_received = 0;
  bool dedup = false;  // a row is one (token, destination rank), not one pair
};

// P(a token has at least one of its K experts on a given rank) when the K
// distinct experts are drawn uniformly: 1 - C(E - E_l, K) / C(E, K).
double probability_rank_hit(std::int64_t num_experts, std::int64_t experts_per_rank, std::int64_t top_k);

// Expected traffic under uniform routing (each token's K distinct experts
// drawn uniformly): pairs_sent = N_l·K·(R-1)/R; rows_sent = pairs_sent
// without dedup, N_l·(R-1)·P(hit) with; received = sent by symmetry.
AllToAllTraffic expected_alltoall_traffic(const DispatchShape& shape, bool dedup);

struct CollectiveBytes {
  std::string name;  // as in ep::DispatchStats::bytes_sent
  double bytes = 0;  // per rank, per MoE layer
};

std::vector<CollectiveBytes> ring_collective_bytes(const DispatchShape& shape, bool remat_x_sorted);
std::vector<CollectiveBytes> alltoall_collective_bytes(const DispatchShape& shape, const AllToAllTraffic& traffic,
                                                       bool remat_x_sorted);
double total_bytes(const std::vector<CollectiveBytes>& collectives);
// The token rows alone (forward, plus the remat repeat): what ring vs
// all-to-all trades against each other.
double token_bytes(const std::vector<CollectiveBytes>& collectives);

std::string to_string(DispatchKind kind);

}  // namespace epmoe::plan
