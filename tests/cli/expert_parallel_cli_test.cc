// End-to-end tests of `epmoe layer` with expert parallelism (ranks=R over the
// threads transport), run as subprocesses like epmoe_cli_test.cc.
//
// Topology: gen-inputs with N=24 tokens, H=8, F=12, E=12 experts; top_k=3.
// With ranks=R, rank r holds token rows [r·24/R, (r+1)·24/R) and experts
// [r·12/R, (r+1)·12/R): R=3 gives rank 0 tokens 0-7 and experts 0-3, rank 1
// tokens 8-15 and experts 4-7, rank 2 tokens 16-23 and experts 8-11. Every R
// in {1, 2, 3, 4} divides both. With K=3 of 12 experts, about 70% of tokens
// have two experts on one rank at R=3, so dedup sends measurably fewer rows.
//
// Each run's outputs (gathered back into single-rank shapes) must equal the
// ranks=1 run within 1e-5 relative (max|a-b| / max|b|; the f32 paths differ
// only in summation order), and its metrics must agree with the routing in
// topk_ids.npy: rows received per expert, bytes per collective.
// Transport: threads, R in {1, 2, 3, 4, 8}; threads=1 (the fixture's runs: one
// compute thread per rank).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/npy.h"
#include "epmoe_cli_fixture.h"

namespace epmoe {
namespace {

using testing::EpmoeCli;
using testing::expect_outputs_match;
using testing::max_relative_difference;
using testing::ProcessResult;
using testing::read_metrics;
using testing::read_output;

constexpr std::int64_t kEpTokens = 24, kEpHidden = 8, kEpExperts = 12, kEpTopK = 3;
constexpr double kTolerance = 1e-5;
constexpr std::int64_t kRowBytes = kEpHidden * 4;  // one f32 token row on the wire

const std::vector<std::string> kSigmoidRouterKeys = {"router=sigmoid_grouped", "n_groups=4", "topk_groups=2",
                                                     "routed_scaling_factor=2.5"};

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::int64_t bytes_of(const nlohmann::json& rank_entry, const std::string& collective) {
  const auto& bytes = rank_entry["bytes_sent"];
  return bytes.contains(collective) ? bytes[collective].get<std::int64_t>() : 0;
}

class ExpertParallelCli : public EpmoeCli {
 protected:
  // Inputs of the topology above and the ranks=1 reference run into
  // reference_dir(); `router_keys` apply to every run of the test.
  void prepare(const std::vector<std::string>& router_keys = {}) {
    router_keys_ = concat({"top_k=" + std::to_string(kEpTopK)}, router_keys);
    const bool with_bias = !router_keys.empty();
    generate_inputs({"num_tokens=" + std::to_string(kEpTokens), "num_experts=" + std::to_string(kEpExperts),
                     with_bias ? "with_bias=true" : "with_bias=false"});
    const ProcessResult reference = run_layer_into(reference_dir(), router_keys_);
    ASSERT_EQ(reference.exit_code, 0) << reference.stderr_text;
  }

  std::filesystem::path reference_dir() const { return scratch_ / "reference"; }

  // Runs with `keys` into a directory of its own; returns it.
  std::filesystem::path run_ep(const std::string& name, const std::vector<std::string>& keys) {
    const std::filesystem::path out = scratch_ / name;
    const ProcessResult result = run_layer_into(out, concat(router_keys_, keys));
    EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
    EXPECT_EQ(result.stderr_text, "");
    return out;
  }

  // Owner rank of each expert id, for R ranks.
  static int owner(std::int32_t expert, int num_ranks) { return static_cast<int>(expert / (kEpExperts / num_ranks)); }
  static int token_rank(std::int64_t token, int num_ranks) { return static_cast<int>(token / (kEpTokens / num_ranks)); }

  std::vector<std::string> router_keys_;
};

// --- equivalence with ranks=1 --------------------------------------------------

struct EpCase {
  std::string name;
  std::vector<std::string> keys;
  int num_ranks;
  bool sigmoid_router = false;
};

void PrintTo(const EpCase& c, std::ostream* os) { *os << c.name; }

class ExpertParallelMatchesOneRank : public ExpertParallelCli, public ::testing::WithParamInterface<EpCase> {};

TEST_P(ExpertParallelMatchesOneRank, OutputsAndMetrics) {
  const EpCase& c = GetParam();
  prepare(c.sigmoid_router ? kSigmoidRouterKeys : std::vector<std::string>{});
  const std::filesystem::path out = run_ep("out", concat({"ranks=" + std::to_string(c.num_ranks)}, c.keys));
  expect_outputs_match(out, reference_dir(), kTolerance);

  const nlohmann::json reference = read_metrics(reference_dir());
  const nlohmann::json metrics = read_metrics(out);
  const nlohmann::json& ep = metrics["expert_parallel"];
  EXPECT_EQ(ep["path"], "dispatcher");
  EXPECT_EQ(ep["ranks"], c.num_ranks);
  ASSERT_EQ(ep["per_rank"].size(), static_cast<std::size_t>(c.num_ranks));

  // Rows per expert depend only on the routing, so rank by rank they equal
  // the single-rank counts of the experts each rank homes.
  std::vector<std::int64_t> rows_per_expert;
  std::map<std::string, std::int64_t> bytes_sent;
  std::int64_t rows_received = 0;
  for (int r = 0; r < c.num_ranks; ++r) {
    const nlohmann::json& rank = ep["per_rank"][r];
    EXPECT_EQ(rank["rank"], r);
    EXPECT_EQ(rank["first_token"], r * kEpTokens / c.num_ranks);
    EXPECT_EQ(rank["num_tokens"], kEpTokens / c.num_ranks);
    EXPECT_EQ(rank["first_expert"], r * kEpExperts / c.num_ranks);
    EXPECT_EQ(rank["num_experts"], kEpExperts / c.num_ranks);
    const auto local = rank["rows_per_local_expert"].get<std::vector<std::int64_t>>();
    EXPECT_EQ(local.size(), static_cast<std::size_t>(kEpExperts / c.num_ranks));
    rows_per_expert.insert(rows_per_expert.end(), local.begin(), local.end());
    rows_received += rank["rows_received"].get<std::int64_t>();
    EXPECT_EQ(rank["dropped_pairs"], 0);
    for (const char* phase : {"route", "dispatch", "experts", "combine", "backward_experts"}) {
      EXPECT_TRUE(rank["phase_seconds"].contains(phase)) << "rank " << r << " lacks " << phase;
    }
    for (const auto& [name, bytes] : rank["bytes_sent"].items()) bytes_sent[name] += bytes.get<std::int64_t>();
    if (c.num_ranks > 1) {  // every rank sends its tokens and gradients somewhere
      EXPECT_GT(rank["bytes_sent_forward"].get<std::int64_t>(), 0) << "rank " << r;
      EXPECT_GT(rank["bytes_sent_backward"].get<std::int64_t>(), 0) << "rank " << r;
    }
  }
  EXPECT_EQ(rows_per_expert, reference["tokens_per_expert"].get<std::vector<std::int64_t>>());
  EXPECT_EQ(metrics["tokens_per_expert"], reference["tokens_per_expert"]);
  EXPECT_EQ(rows_received, kEpTokens * kEpTopK);  // no pair dropped
  EXPECT_EQ(ep["total"]["rows_received"], kEpTokens * kEpTopK);
  EXPECT_EQ(ep["total"]["dropped_pairs"], 0);
  EXPECT_EQ(ep["total"]["bytes_sent"].get<decltype(bytes_sent)>(), bytes_sent);
}

INSTANTIATE_TEST_SUITE_P(
    Dispatchers, ExpertParallelMatchesOneRank,
    ::testing::Values(EpCase{"alltoall_r2", {}, 2}, EpCase{"alltoall_r3", {}, 3}, EpCase{"alltoall_r4", {}, 4},
                      EpCase{"alltoall_dedup_r3", {"dedup=true"}, 3}, EpCase{"alltoall_dedup_r4", {"dedup=true"}, 4},
                      EpCase{"alltoall_chunks2_r3", {"token_chunks=2"}, 3},
                      EpCase{"alltoall_emulated_ring_links_r2",
                             {"link_bandwidth_gbps=1", "link_latency_us=5", "link_topology=ring"},
                             2},
                      EpCase{"ring_r1", {"dispatch=ring"}, 1}, EpCase{"ring_r2", {"dispatch=ring"}, 2},
                      EpCase{"ring_r3", {"dispatch=ring"}, 3}, EpCase{"ring_r4", {"dispatch=ring"}, 4},
                      EpCase{"ring_chunks2_r4", {"dispatch=ring", "token_chunks=2"}, 4},
                      EpCase{"ring_plain_cotangent_r3", {"dispatch=ring", "cotangent_all_gather=plain"}, 3},
                      EpCase{"sigmoid_grouped_alltoall_dedup_r3", {"dedup=true"}, 3, true},
                      EpCase{"sigmoid_grouped_ring_chunks2_r4", {"dispatch=ring", "token_chunks=2"}, 4, true}),
    [](const ::testing::TestParamInfo<EpCase>& info) { return info.param.name; });

// --- metrics against the routing ----------------------------------------------

// Without dedup every (token, k) pair routed off its rank travels as one row:
// rank r sends 4H bytes per pair of its tokens homed elsewhere, gets the
// same rows back through the combine, and the backward mirrors both.
TEST_F(ExpertParallelCli, AllToAllBytesFollowTheRouting) {
  prepare();
  constexpr int kRanks = 3;
  const std::filesystem::path out = run_ep("out", {"ranks=3"});
  const Tensor ids = read_output(out, "topk_ids");
  std::vector<std::int64_t> pairs_sent(kRanks, 0), pairs_received_from_others(kRanks, 0);
  for (std::int64_t t = 0; t < kEpTokens; ++t) {
    for (std::int64_t k = 0; k < kEpTopK; ++k) {
      const int source = token_rank(t, kRanks);
      const int destination = owner(ids.data<std::int32_t>()[t * kEpTopK + k], kRanks);
      if (source != destination) {
        ++pairs_sent[source];
        ++pairs_received_from_others[destination];
      }
    }
  }
  const nlohmann::json metrics = read_metrics(out);
  for (int r = 0; r < kRanks; ++r) {
    const nlohmann::json& rank = metrics["expert_parallel"]["per_rank"][r];
    EXPECT_EQ(bytes_of(rank, "forward/all_to_all_v tokens"), pairs_sent[r] * kRowBytes) << "rank " << r;
    EXPECT_EQ(bytes_of(rank, "backward/all_to_all_v cotangent"), pairs_sent[r] * kRowBytes) << "rank " << r;
    EXPECT_EQ(bytes_of(rank, "forward/all_to_all_v combine"), pairs_received_from_others[r] * kRowBytes)
        << "rank " << r;
    EXPECT_EQ(bytes_of(rank, "backward/all_to_all_v dx"), pairs_received_from_others[r] * kRowBytes) << "rank " << r;
  }
}

// With dedup a token travels once to each other rank homing any of its
// experts, however many of them that rank homes.
TEST_F(ExpertParallelCli, DedupSendsOneRowPerTokenAndDestinationRank) {
  prepare();
  constexpr int kRanks = 3;
  const std::filesystem::path plain = run_ep("plain", {"ranks=3"});
  const std::filesystem::path dedup = run_ep("dedup", {"ranks=3", "dedup=true"});
  const Tensor ids = read_output(dedup, "topk_ids");
  std::vector<std::int64_t> rows_sent(kRanks, 0);
  for (std::int64_t t = 0; t < kEpTokens; ++t) {
    std::set<int> destinations;
    for (std::int64_t k = 0; k < kEpTopK; ++k) {
      destinations.insert(owner(ids.data<std::int32_t>()[t * kEpTopK + k], kRanks));
    }
    destinations.erase(token_rank(t, kRanks));
    rows_sent[token_rank(t, kRanks)] += static_cast<std::int64_t>(destinations.size());
  }
  const nlohmann::json dedup_metrics = read_metrics(dedup), plain_metrics = read_metrics(plain);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(bytes_of(dedup_metrics["expert_parallel"]["per_rank"][r], "forward/all_to_all_v tokens"),
              rows_sent[r] * kRowBytes)
        << "rank " << r;
  }
  const auto total_tokens_bytes = [](const nlohmann::json& m) {
    return m["expert_parallel"]["total"]["bytes_sent"]["forward/all_to_all_v tokens"].get<std::int64_t>();
  };
  EXPECT_LT(total_tokens_bytes(dedup_metrics), total_tokens_bytes(plain_metrics));
}

// The ring all-gathers every token to every rank: (R-1) * N_l rows per rank.
TEST_F(ExpertParallelCli, RingGathersEveryTokenToEveryRank) {
  prepare();
  constexpr int kRanks = 4;
  const nlohmann::json metrics = read_metrics(run_ep("out", {"ranks=4", "dispatch=ring"}));
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(bytes_of(metrics["expert_parallel"]["per_rank"][r], "forward/ring_all_gather tokens"),
              (kRanks - 1) * (kEpTokens / kRanks) * kRowBytes)
        << "rank " << r;
  }
}

// A capacity below the load drops pairs; each one is counted, so computed
// rows plus dropped pairs account for every (token, expert) pair.
TEST_F(ExpertParallelCli, CapacityDropsAreCountedNotLost) {
  prepare();
  const nlohmann::json metrics = read_metrics(run_ep("out", {"ranks=3", "capacity_factor=0.5"}));
  const nlohmann::json& total = metrics["expert_parallel"]["total"];
  EXPECT_GT(total["dropped_pairs"].get<std::int64_t>(), 0);
  EXPECT_EQ(total["rows_received"].get<std::int64_t>() + total["dropped_pairs"].get<std::int64_t>(),
            kEpTokens * kEpTopK);
  std::int64_t dropped = 0;
  for (const nlohmann::json& rank : metrics["expert_parallel"]["per_rank"]) {
    dropped += rank["dropped_pairs"].get<std::int64_t>();
  }
  EXPECT_EQ(dropped, total["dropped_pairs"]);
}

// fp8 e4m3 keeps 3 mantissa bits: each token element is off by at most 2^-4
// relative (half an ulp) of its scale. y passes two such GEMM inputs through
// the SwiGLU product, so ~2 * 2^-4; 2^-3 of max|y| bounds it. The routing
// runs before dispatch and must not change; y must change (the tokens really
// travelled as fp8).
TEST_F(ExpertParallelCli, Fp8TokensStayWithinTheirBound) {
  prepare();
  for (const std::string format : {"tensor", "token"}) {
    const std::filesystem::path out = run_ep("fp8_" + format, {"ranks=2", "fp8_tokens=" + format});
    EXPECT_EQ(max_relative_difference(read_output(out, "topk_ids"), read_output(reference_dir(), "topk_ids")), 0.0);
    const double y_difference = max_relative_difference(read_output(out, "y"), read_output(reference_dir(), "y"));
    EXPECT_GT(y_difference, 0.0) << format;
    EXPECT_LT(y_difference, 0.125) << format;
    EXPECT_EQ(read_metrics(out)["expert_parallel"]["dispatcher"]["fp8_tokens"], format);
  }
}

TEST_F(ExpertParallelCli, MetricsEchoTheResolvedDispatcher) {
  prepare();
  const nlohmann::json metrics = read_metrics(
      run_ep("out", {"ranks=2", "dispatch=ring", "token_chunks=2", "link_bandwidth_gbps=25", "comm_timeout_ms=5000"}));
  const nlohmann::json& dispatcher = metrics["expert_parallel"]["dispatcher"];
  EXPECT_EQ(dispatcher["dispatch"], "ring");
  EXPECT_EQ(dispatcher["token_chunks"], 2);
  EXPECT_EQ(dispatcher["comm_timeout_ms"], 5000);
  EXPECT_EQ(dispatcher["backward_gradient_dtype"], "f32");
  EXPECT_EQ(dispatcher["emulated_links"]["enabled"], true);
  EXPECT_EQ(dispatcher["emulated_links"]["bandwidth_gb_per_s"], 25.0);
  EXPECT_EQ(dispatcher["emulated_links"]["topology"], "full_mesh");
  EXPECT_EQ(metrics["expert_parallel"]["transport"], "threads");
  EXPECT_EQ(metrics["config"]["ranks"], 2);
}

// wire_dtype: auto is f32 with compute_dtype=f32 (the default path); bf16
// puts the combine, dy and dx on a bf16 wire and the tokens too, unless
// fp8_tokens chooses their format.
TEST_F(ExpertParallelCli, WireDtypeResolvesWithTheTokenFormat) {
  prepare();
  struct Case {
    std::vector<std::string> keys;
    std::string wire, tokens;
  };
  for (const Case& c : {Case{{}, "f32", "off"}, Case{{"wire_dtype=bf16"}, "bf16", "bf16"},
                        Case{{"wire_dtype=bf16", "fp8_tokens=token"}, "bf16", "token"}}) {
    std::vector<std::string> keys = {"ranks=2"};
    keys.insert(keys.end(), c.keys.begin(), c.keys.end());
    const nlohmann::json dispatcher =
        read_metrics(run_ep("wire_" + c.wire + "_" + c.tokens, keys))["expert_parallel"]["dispatcher"];
    EXPECT_EQ(dispatcher["wire_dtype"], c.wire) << c.tokens;
    EXPECT_EQ(dispatcher["backward_gradient_dtype"], c.wire) << c.tokens;
    EXPECT_EQ(dispatcher["fp8_tokens"], c.tokens) << c.wire;
  }
}

// --- bad input -------------------------------------------------------------------

// N need not divide by R: with N=22 and R=4 the ranks hold 5, 6, 5 and 6
// token rows ([r*22/4, (r+1)*22/4)); with N=7 and R=2 they hold 3 and 4. Both
// dispatchers (the ring all-gathers and reduce-scatters unequal blocks) and
// their chunked and fp8 forms give the ranks=1 outputs (fp8 within its bound,
// against the alltoall in fp8, whose rows carry the same codes).
TEST_F(EpmoeCli, UnequalTokenRowsPerRankMatchOneRank) {
  for (const std::int64_t num_tokens : {22, 7}) {
    SCOPED_TRACE("N=" + std::to_string(num_tokens));
    generate_inputs({"num_tokens=" + std::to_string(num_tokens), "num_experts=12"});
    const std::filesystem::path reference = scratch_ / ("reference_" + std::to_string(num_tokens));
    const ProcessResult one = run_layer_into(reference, {"top_k=3"});
    ASSERT_EQ(one.exit_code, 0) << one.stderr_text;
    for (const std::vector<std::string>& keys : std::vector<std::vector<std::string>>{
             {"ranks=2", "dispatch=ring"},
             {"ranks=4", "dispatch=ring", "token_chunks=2"},
             {"ranks=4", "dispatch=ring", "cotangent_all_gather=plain", "remat_policy=full"},
             {"ranks=3", "dispatch=alltoall", "dedup=true"},
             {"ranks=4", "dispatch=alltoall"}}) {
      std::string name = "n" + std::to_string(num_tokens);
      for (const std::string& key : keys) name += "_" + key;
      SCOPED_TRACE(name);
      const std::filesystem::path out = scratch_ / name;
      std::vector<std::string> all = keys;
      all.push_back("top_k=3");
      const ProcessResult result = run_layer_into(out, all);
      ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
      expect_outputs_match(out, reference, 1e-5);
      const nlohmann::json metrics = read_metrics(out);
      const nlohmann::json& per_rank = metrics["expert_parallel"]["per_rank"];
      std::int64_t rows = 0;
      for (std::size_t r = 0; r < per_rank.size(); ++r) {
        const std::int64_t num_ranks = static_cast<std::int64_t>(per_rank.size());
        const std::int64_t r64 = static_cast<std::int64_t>(r);
        EXPECT_EQ(per_rank[r]["first_token"], r64 * num_tokens / num_ranks);
        EXPECT_EQ(per_rank[r]["num_tokens"], (r64 + 1) * num_tokens / num_ranks - r64 * num_tokens / num_ranks);
        rows += per_rank[r]["num_tokens"].get<std::int64_t>();
      }
      EXPECT_EQ(rows, num_tokens);
    }
    const ProcessResult ring_fp8 = run_layer_into(scratch_ / ("ring_fp8_" + std::to_string(num_tokens)),
                                                  {"top_k=3", "ranks=2", "dispatch=ring", "fp8_tokens=token"});
    const ProcessResult a2a_fp8 = run_layer_into(scratch_ / ("a2a_fp8_" + std::to_string(num_tokens)),
                                                 {"top_k=3", "ranks=2", "dispatch=alltoall", "fp8_tokens=token"});
    ASSERT_EQ(ring_fp8.exit_code, 0) << ring_fp8.stderr_text;
    ASSERT_EQ(a2a_fp8.exit_code, 0) << a2a_fp8.stderr_text;
    expect_outputs_match(scratch_ / ("ring_fp8_" + std::to_string(num_tokens)),
                         scratch_ / ("a2a_fp8_" + std::to_string(num_tokens)), 1e-5);
  }
}

TEST_F(EpmoeCli, RejectsRanksThatDoNotDivideTheExperts) {
  generate_inputs({"num_tokens=24", "num_experts=12"});
  expect_rejected(run_layer({"ranks=8"}), {"ranks=8: must divide num_experts=12"});
}

TEST_F(EpmoeCli, RejectsCapacityFactorWithRingDispatch) {
  generate_inputs();
  expect_rejected(run_layer({"ranks=2", "dispatch=ring", "capacity_factor=1.5"}),
                  {"capacity_factor=1.5: applies to dispatch=alltoall only", "never drops"});
}

TEST_F(EpmoeCli, RejectsDedupWithRingDispatch) {
  generate_inputs();
  expect_rejected(run_layer({"ranks=2", "dispatch=ring", "dedup=true"}),
                  {"dedup=true: applies to dispatch=alltoall only"});
}

TEST_F(EpmoeCli, RejectsPlainCotangentAllGatherWithAllToAll) {
  generate_inputs();
  expect_rejected(run_layer({"ranks=2", "cotangent_all_gather=plain"}),
                  {"cotangent_all_gather=plain: applies to dispatch=ring only"});
}

TEST_F(EpmoeCli, RejectsMpiTransportOutsideMpirun) {
  generate_inputs();
  expect_rejected(run_layer({"transport=mpi"}), {"transport=mpi: not started by mpirun", "mpirun -np R"});
}

TEST_F(EpmoeCli, RejectsTokenChunksAboveTheLimit) {
  generate_inputs();
  expect_rejected(run_layer({"ranks=2", "token_chunks=65"}), {"token_chunks=65: must be <= 64"});
}

}  // namespace
}  // namespace epmoe

namespace epmoe {
namespace {

using testing::layer_output_names;
using testing::read_bytes;
using testing::read_metrics;

// remat_policy changes what backward keeps, never the numbers: every output
// file is byte-identical, and metrics.json reports the trade.
TEST_F(ExpertParallelCli, RematPoliciesGiveIdenticalFilesAndReportTheTrade) {
  prepare();
  const auto saved = run_ep("saved", {"ranks=4", "dispatch=ring", "remat_policy=minimal"});
  const auto recomputed = run_ep("recomputed", {"ranks=4", "dispatch=ring", "remat_policy=full"});
  for (const std::string& name : layer_output_names()) {
    EXPECT_EQ(read_bytes(saved / (name + ".npy")), read_bytes(recomputed / (name + ".npy"))) << name;
  }
  const nlohmann::json saved_remat = read_metrics(saved)["remat"];
  const nlohmann::json recomputed_remat = read_metrics(recomputed)["remat"];
  EXPECT_GT(saved_remat["saved_activation_peak_bytes"].get<std::int64_t>(), 0);
  EXPECT_EQ(saved_remat["recomputed_bytes"].get<std::int64_t>(), 0);
  EXPECT_EQ(recomputed_remat["saved_activation_peak_bytes"].get<std::int64_t>(), 0);
  EXPECT_EQ(recomputed_remat["recomputed_bytes"], saved_remat["saved_activation_peak_bytes"]);
  EXPECT_GT(recomputed_remat["extra_communication_bytes"].get<std::int64_t>(), 0);
  // Per rank: saved names only under saved_peak_bytes_by_name; the
  // dispatcher's kept buffers apart, present whatever the policy.
  const nlohmann::json recomputed_metrics = read_metrics(recomputed);  // alive for the loop below
  for (const auto& rank : recomputed_metrics["expert_parallel"]["per_rank"]) {
    for (const auto& [name, bytes] : rank["saved_peak_bytes_by_name"].items())
      EXPECT_TRUE(name.starts_with("saved/")) << name;
    EXPECT_GT(rank["buffer_bytes_by_name"]["buffer/dispatch"].get<std::int64_t>(), 0);
  }
}

TEST_F(EpmoeCli, RejectsPerNameRematKeysWithoutCustomPolicy) {
  generate_inputs();
  expect_rejected(run_layer({"remat.x_sorted=remat"}), {"remat.x_sorted is only read with remat_policy=custom"});
}

}  // namespace
}  // namespace epmoe
