// The bytes every dispatcher reports (DispatchStats::bytes_sent, summed over
// its kinds) against what the threads transport itself counted the rank
// sending to the other ranks (Communicator::sent_bytes, cross-checked by tag
// through ThreadsCommunicator::sent_bytes_by_tag: payload bytes at isend; the
// threads transport's messages have no header of their own, and a send to
// self is not counted). Not against the dispatchers' formulas: a kind that
// is miscounted, or a stream no kind reports, fails here. Every stream
// counts, the small control ones too (the all_to_all_v count round, the
// fp8_tensor scale all-gather, the replica planner's counts all-gather, the
// ring's token counts all-gather): the transport's count must be exactly the
// sum of the kinds.
// Topology: ranks as threads, threads transport, one compute thread each;
// R in {1, 2, 3, 4}; experts E = max(4, 2R), rank r homes [E·r/R, E·(r+1)/R);
// 6 tokens per rank or tokens_by_rank with a rank holding none; every step of
// each run checked per rank. Dispatchers: local (R = 1), alltoall (dedup
// on/off, fp8 tokens, 2-3 chunks, x_sorted recomputed, dynamic replicas,
// a bf16 wire), ring (fp8 tokens, chunks, x_sorted recomputed, replicas, a
// bf16 wire).
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "balance/routing_skew.h"
#include "ep_harness.h"

namespace epmoe {
namespace {

using testing::EpRunOptions;
using testing::MoeProblem;

struct BytesCase {
  std::string name;
  int num_ranks = 1;
  EpRunOptions options;
  bool skewed = false;  // Zipf-packed routing, so that the replica planner places replicas
};

MoeProblem problem_for(const BytesCase& c) {
  const int num_experts = std::max(4, 2 * c.num_ranks);
  RouterConfig router{.kind = c.skewed ? RouterKind::sigmoid_grouped : RouterKind::softmax_topk,
                      .num_experts = num_experts,
                      .top_k = c.skewed ? 2 : 3};
  std::int64_t num_tokens = 6 * c.num_ranks;
  if (!c.options.tokens_by_rank.empty())
    num_tokens = std::accumulate(c.options.tokens_by_rank.begin(), c.options.tokens_by_rank.end(), std::int64_t{0});
  MoeProblem p = testing::make_problem(num_tokens, 8, 6, router, 700 + c.num_ranks);
  if (c.skewed) {
    const std::vector<float> bias = balance::zipf_selection_bias({.num_experts = num_experts,
                                                                  .num_ranks = c.num_ranks,
                                                                  .zipf_exponent = 1.2,
                                                                  .placement = balance::HotExpertPlacement::packed,
                                                                  .scale = 1.0});
    for (int e = 0; e < num_experts; ++e) p.bias.data<float>()[e] = bias[e];
  }
  return p;
}

std::vector<BytesCase> cases() {
  std::vector<BytesCase> out;
  auto add = [&](std::string name, int num_ranks, DispatchKind kind, auto&& configure, bool skewed = false) {
    BytesCase c{std::move(name), num_ranks, EpRunOptions{.num_ranks = num_ranks, .dispatch = kind}, skewed};
    configure(c.options);
    out.push_back(std::move(c));
  };
  auto plain = [](EpRunOptions&) {};
  auto dedup = [](EpRunOptions& o) { o.ep.dedup = true; };
  auto fp8 = [](EpRunOptions& o) { o.ep.token_format = TokenFormat::fp8_token; };
  auto fp8_tensor_chunks = [](EpRunOptions& o) {
    o.ep.token_format = TokenFormat::fp8_tensor;
    o.ep.num_chunks = 2;
  };
  auto chunks = [](EpRunOptions& o) { o.ep.num_chunks = 2; };
  auto dedup_chunks_remat = [](EpRunOptions& o) {
    o.ep.dedup = true;
    o.ep.num_chunks = 3;
    o.remat.save_x_sorted = false;
  };
  // Two steps with new weights each, then one with the same: replica
  // weights are sent, sent again, then not.
  auto replicas = [](EpRunOptions& o) {
    o.ep.balance = BalanceMode::dynamic;
    o.ep.redundant_slots = 1;
    o.ep.rebalance_threshold = 1.0;
    o.weight_versions = {1, 2, 2};
  };
  auto replicas_dedup_chunks = [&](EpRunOptions& o) {
    replicas(o);
    o.ep.dedup = true;
    o.ep.num_chunks = 2;
  };
  add("local R1 chunks2", 1, DispatchKind::alltoall, [](EpRunOptions& o) {
    o.local_dispatcher = true;
    o.ep.num_chunks = 2;
  });
  for (int r : {1, 2, 3, 4}) {
    add("alltoall R" + std::to_string(r), r, DispatchKind::alltoall, plain);
    add("ring R" + std::to_string(r), r, DispatchKind::ring, plain);
  }
  for (int r : {2, 3, 4}) add("alltoall dedup R" + std::to_string(r), r, DispatchKind::alltoall, dedup);
  add("alltoall fp8_token R3", 3, DispatchKind::alltoall, fp8);
  add("alltoall fp8_tensor chunks2 R4", 4, DispatchKind::alltoall, fp8_tensor_chunks);
  add("alltoall chunks2 R4", 4, DispatchKind::alltoall, chunks);
  add("alltoall dedup chunks3 remat R3", 3, DispatchKind::alltoall, dedup_chunks_remat);
  add("ring fp8_token R3", 3, DispatchKind::ring, fp8);
  add("ring fp8_tensor chunks2 R4", 4, DispatchKind::ring, fp8_tensor_chunks);
  // wire_dtype=bf16 with bf16 tokens (what the key layer makes of it).
  auto bf16_wire_chunks = [](EpRunOptions& o) {
    o.ep.wire_dtype = WireDType::bf16;
    o.ep.token_format = TokenFormat::bf16;
    o.ep.num_chunks = 2;
  };
  add("alltoall dedup bf16 wire chunks2 R3", 3, DispatchKind::alltoall, [&](EpRunOptions& o) {
    bf16_wire_chunks(o);
    o.ep.dedup = true;
  });
  add("ring bf16 wire chunks2 R3", 3, DispatchKind::ring, bf16_wire_chunks);
  add("ring chunks3 remat R3", 3, DispatchKind::ring, [](EpRunOptions& o) {
    o.ep.num_chunks = 3;
    o.remat.save_x_sorted = false;
  });
  for (int r : {2, 3}) {
    add("alltoall replicas R" + std::to_string(r), r, DispatchKind::alltoall, replicas, true);
    add("ring replicas R" + std::to_string(r), r, DispatchKind::ring, replicas, true);
  }
  add("alltoall replicas dedup chunks2 R4", 4, DispatchKind::alltoall, replicas_dedup_chunks, true);
  // replica_costs=measured: the first plan's probe messages and all-gather.
  for (const DispatchKind dispatch : {DispatchKind::alltoall, DispatchKind::ring})
    add(
        to_string(dispatch) + " replicas measured rates R3", 3, dispatch,
        [&](EpRunOptions& o) {
          replicas(o);
          o.ep.replica_costs.measure = true;
        },
        true);
  // A rank with no tokens.
  for (DispatchKind kind : {DispatchKind::alltoall, DispatchKind::ring}) {
    const std::string name = kind == DispatchKind::ring ? "ring" : "alltoall dedup";
    add(name + " tokens {2,0,7}", 3, kind, [&](EpRunOptions& o) {
      o.ep.dedup = kind == DispatchKind::alltoall;
      o.tokens_by_rank = {2, 0, 7};
    });
    add(name + " tokens {5,1,0,3} chunks2", 4, kind, [&](EpRunOptions& o) {
      o.ep.dedup = kind == DispatchKind::alltoall;
      o.ep.num_chunks = 2;
      o.tokens_by_rank = {5, 1, 0, 3};
    });
  }
  return out;
}

std::int64_t sum_of_kinds(const ep::DispatchStats& stats) {
  std::int64_t total = 0;
  for (const auto& [kind, bytes] : stats.bytes_sent) total += bytes;
  return total;
}

std::string kinds_of(const ep::DispatchStats& stats) {
  std::string out;
  for (const auto& [kind, bytes] : stats.bytes_sent) out += "  " + kind + ": " + std::to_string(bytes) + "\n";
  return out;
}

TEST(TransportBytes, DispatcherKindsSumToWhatTheTransportCarried) {
  std::map<std::string, std::int64_t> kind_total;  // over every case, step and rank
  for (const BytesCase& c : cases()) {
    const MoeProblem p = problem_for(c);
    const testing::EpRunResult run = testing::run_ep_layer(p, c.options);
    ASSERT_EQ(run.step_transport_sent.size(), run.step_stats.size()) << c.name;
    std::int64_t carried = 0;
    for (std::size_t step = 0; step < run.step_stats.size(); ++step)
      for (int r = 0; r < c.num_ranks; ++r) {
        const transport::SentBytes& sent = run.step_transport_sent[step][r];
        const ep::DispatchStats& stats = run.step_stats[step][r];
        std::int64_t by_tag_total = 0;
        for (const auto& [tag, bytes] : run.step_transport_sent_by_tag[step][r]) by_tag_total += bytes;
        EXPECT_EQ(by_tag_total, sent.total) << c.name << ": the transport's two counts of one rank";
        EXPECT_EQ(sum_of_kinds(stats), sent.total)
            << c.name << ", step " << step << ", rank " << r << ": the dispatcher reported\n"
            << kinds_of(stats);
        for (const auto& [kind, bytes] : stats.bytes_sent) kind_total[kind] += bytes;
        EXPECT_EQ(sent.to_peer[r], 0) << c.name << ": a send to self is not a transfer";
        carried += sent.total;
      }
    if (c.num_ranks == 1) {
      EXPECT_EQ(carried, 0) << c.name << ": one rank sends nothing";
    } else {
      EXPECT_GT(carried, 0) << c.name << ": tokens must have travelled";
    }
  }
  // The cases send every control stream, so the sums above hold them too.
  for (const char* kind :
       {"forward/all_to_all_v counts", "forward/ring_all_gather fp8 scale", "forward/ring_all_gather replica counts",
        "forward/ring token counts", "forward/replica rate probe"})
    EXPECT_GT(kind_total[kind], 0) << kind;
}

}  // namespace
}  // namespace epmoe
