// `epmoe layer clock=modelled` end to end: timing properties of real
// execution (compute_time=modelled, so every modelled time is a function of
// config and seed alone).
//
// Topology: ranks as threads in one process (transport=threads); R = 4
// (determinism, imbalance, token chunks) and R = 64 (scale), on the h100
// preset: switched links (one port per GPU, 450 GB/s each way, a rank's
// sends share its port), link_latency_us as stated per test; the chunk
// pipeline against the rules on full_mesh links (one per ordered pair).
// threads=1 (modelled_cli_fixture.h): one compute thread per rank.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <sstream>

#include "chunk_pipeline.h"
#include "modelled_cli_fixture.h"

namespace epmoe::testing {
namespace {

class ModelledLayer : public ModelledCli {};

// Seconds rank r's trace spent in compute events named `name` that start
// before `before_seconds`.
double traced_seconds(const nlohmann::json& events, int r, const std::string& name, double before_seconds) {
  double seconds = 0;
  for (const nlohmann::json& e : events) {
    if (e.value("cat", "") != "compute" || e.at("name") != name || e.at("pid").get<int>() != r) continue;
    if (e.at("ts").get<double>() * 1e-6 < before_seconds) seconds += e.at("dur").get<double>() * 1e-6;
  }
  return seconds;
}

// --- 2. determinism ----------------------------------------------------------

TEST_F(ModelledLayer, SameConfigTwiceGivesIdenticalModelledMetrics) {
  const std::filesystem::path in = dir("in");
  generate(in, {.tokens = 256, .hidden = 32, .ffn = 48, .experts = 8});
  for (const std::string dispatch : {"alltoall", "ring"}) {
    std::vector<std::string> keys = {"ranks=4",        "clock=modelled",  "dispatch=" + dispatch,
                                     "token_chunks=2", "balance=dynamic", "redundant_slots=1"};
    if (dispatch == "alltoall") keys.push_back("dedup=true");  // ring rejects dedup (it sends each token once)
    const nlohmann::json first = layer_metrics(in, keys);
    const nlohmann::json second = layer_metrics(in, keys);
    ASSERT_FALSE(first.is_null() || second.is_null()) << dispatch;
    ASSERT_TRUE(first.contains("modelled")) << dispatch;
    EXPECT_EQ(first.at("modelled"), second.at("modelled")) << dispatch;
    // And the per-rank modelled reports (collective by collective) and phases.
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(rank_report(first, r).at("modelled"), rank_report(second, r).at("modelled"))
          << dispatch << " rank " << r;
      EXPECT_EQ(rank_report(first, r).at("phase_seconds"), rank_report(second, r).at("phase_seconds"))
          << dispatch << " rank " << r;
    }
    EXPECT_GT(first.at("modelled").at("step_seconds").get<double>(), 0) << dispatch;
  }
}

// The all-to-all dispatcher's exchanges per chunk: one in the forward
// (the routing words travel inside the token message, so there is one count
// round, not one for the tokens and one for the words), the combine, and the
// backward's cotangent, dx and dweights (known counts, no count round); a
// remat re-dispatch adds one. Counted by the modelled report, over all ranks.
TEST_F(ModelledLayer, TheAllToAllTakesOneExchangeForTokensAndRouting) {
  const std::filesystem::path in = dir("in");
  generate(in, {.tokens = 48, .hidden = 16, .ffn = 12, .experts = 6});
  for (const int ranks : {2, 3}) {
    for (const int chunks : {1, 3}) {
      for (const bool remat : {false, true}) {
        std::vector<std::string> keys = {"ranks=" + std::to_string(ranks), "clock=modelled", "dispatch=alltoall",
                                         "dedup=true", "token_chunks=" + std::to_string(chunks)};
        if (remat) keys.push_back("remat_policy=full");
        const nlohmann::json m = layer_metrics(in, keys);
        ASSERT_FALSE(m.is_null());
        EXPECT_EQ(m.at("modelled").at("collectives").at("all_to_all_v").at("count").get<int>(),
                  ranks * chunks * (remat ? 6 : 5))
            << "ranks " << ranks << " chunks " << chunks << (remat ? " remat" : "");
      }
    }
  }
}

// The ring dispatcher's token counts (one int64 per rank) travel as one
// message to every peer, posted at once, while the rank encodes its first
// chunk - not as a ring all-gather of R-1 store-and-forward steps that the
// token all-gather had to wait for (issue 30: ·α, 14 us at R=8). On
// h200's switched links (R=8) the first token all-gather starts within one
// hop of the count exchange: the counts' latency, their serialisation of 8
// bytes per message (picoseconds) and the chunk's encoding (nanoseconds).
TEST_F(ModelledLayer, TheRingsTokenCountsCostOneHopBeforeTheTokensLeave) {
  const std::filesystem::path in = dir("in");
  generate(in, {.tokens = 256, .hidden = 32, .ffn = 48, .experts = 8});
  constexpr double kLatencyUs = 2.0;
  const std::filesystem::path trace = dir("ring_counts.json");
  const nlohmann::json metrics =
      layer_metrics(in, {"ranks=8", "dispatch=ring", "clock=modelled", "compute_time=modelled", "hardware=h200",
                         "link_latency_us=2", "trace_file=" + trace.string()});
  ASSERT_FALSE(metrics.is_null());
  const nlohmann::json events = check_trace_structure(trace, 1e-6, "ring counts");
  // Per rank: when the count exchange (the collective of one int64 to each
  // of the 7 others: 56 bytes, whatever its algorithm) and the first token
  // all-gather (thousands of bytes) began.
  std::map<int, double> counts_us, first_tokens_us;
  for (const nlohmann::json& e : events) {
    if (e.value("cat", "") != "collective") continue;
    const int rank = e.at("pid").get<int>();
    const double ts = e.at("ts").get<double>(), bytes = e.at("args").at("bytes_sent").get<double>();
    if (bytes == 56 && (!counts_us.contains(rank) || ts < counts_us[rank])) counts_us[rank] = ts;
    const bool tokens = e.at("name").get<std::string>().starts_with("ring_all_gather") && bytes > 1000;
    if (tokens && (!first_tokens_us.contains(rank) || ts < first_tokens_us[rank])) first_tokens_us[rank] = ts;
  }
  ASSERT_EQ(first_tokens_us.size(), 8u);
  ASSERT_EQ(counts_us.size(), 8u);
  for (const auto& [rank, tokens_us] : first_tokens_us) {
    EXPECT_GE(tokens_us, counts_us[rank]) << "rank " << rank;
    EXPECT_LE(tokens_us - counts_us[rank], kLatencyUs + 0.01)
        << "rank " << rank << ": the token all-gather began " << tokens_us - counts_us[rank]
        << " us after the count exchange (7 hops would be " << 7 * kLatencyUs << " us)";
  }
}

// wire_dtype=bf16 halves the combine's, the cotangent's and dx's bytes, and
// the modelled clock charges what travels: the collectives' modelled bytes
// drop by exactly half those streams' f32 bytes, and their time and the step
// shrink. Tokens stay f32 (fp8_tokens=off) so only those three streams
// change. R=4, 2 chunks, h200's links, modelled compute.
TEST_F(ModelledLayer, ABf16WireHalvesTheBytesTheClockCharges) {
  const std::filesystem::path in = dir("in");
  generate(in, {.tokens = 256, .hidden = 256, .ffn = 64, .experts = 8});
  for (const std::string dispatch : {"alltoall", "ring"}) {
    std::map<std::string, nlohmann::json> runs;
    for (const std::string wire : {"f32", "bf16"}) {
      runs[wire] =
          layer_metrics(in, {"ranks=4", "dispatch=" + dispatch, "token_chunks=2", "clock=modelled",
                             "compute_time=modelled", "hardware=h200", "fp8_tokens=off", "wire_dtype=" + wire});
      ASSERT_FALSE(runs[wire].is_null()) << dispatch << " " << wire;
    }
    const std::string exchange = dispatch == "ring" ? "reduce_scatter " : "all_to_all_v ";
    const std::string gather = dispatch == "ring" ? "ring_all_gather " : "all_to_all_v ";
    const nlohmann::json& sent = runs["f32"].at("expert_parallel").at("total").at("bytes_sent");
    const double halved = sent.at("forward/" + exchange + "combine").get<double>() +
                          sent.at("backward/" + gather + "cotangent").get<double>() +
                          sent.at("backward/" + exchange + "dx").get<double>();
    ASSERT_GT(halved, 0) << dispatch;
    std::map<std::string, double> bytes, seconds;
    for (const auto& [wire, m] : runs) {
      for (const auto& [name, collective] : m.at("modelled").at("collectives").items()) {
        bytes[wire] += collective.at("bytes_sent").get<double>();
        seconds[wire] += collective.at("seconds").get<double>();
      }
    }
    EXPECT_EQ(bytes["f32"] - bytes["bf16"], halved / 2) << dispatch;
    EXPECT_LT(seconds["bf16"], seconds["f32"]) << dispatch;
    EXPECT_LT(runs["bf16"].at("modelled").at("step_seconds").get<double>(),
              runs["f32"].at("modelled").at("step_seconds").get<double>())
        << dispatch;
  }
}

// --- 3. imbalance ------------------------------------------------------------

TEST_F(ModelledLayer, ARankWithTwiceTheRowsIsTheCriticalPath) {
  // R=4, E=8 (experts 2r, 2r+1 on rank r), K=2, N=800: token t's experts by
  // t mod 10: 0-3 -> (rank 0, rank 1), 4-7 -> (rank 0, rank 2), 8-9 ->
  // (rank 3, rank 3), alternating the expert within each rank, so per block
  // of 10 tokens rank 0 receives 8 (token, expert) rows and ranks 1-3 4 each
  // (2 per local expert): rank 0 computes exactly twice the expert rows.
  const std::filesystem::path in = dir("in");
  generate(in, {.tokens = 800, .hidden = 64, .ffn = 256, .experts = 8});
  craft_routing(in, [](std::int64_t t) -> std::pair<int, int> {
    const int slot = static_cast<int>(t % 10), alt = static_cast<int>((t / 10) % 2);
    if (slot < 4) return {0 + alt, 2 + alt};
    if (slot < 8) return {0 + alt, 4 + alt};
    return {6, 7};
  });
  // The h100's 450 GB/s, and links 1 PB/s fast (serialisation ~0; the 2 us
  // latency stays, equal for every message).
  for (const double gbps : {450.0, 1e6}) {
    const std::string what = "link_bandwidth_gbps=" + std::to_string(gbps);
    const nlohmann::json m =
        layer_metrics(in, {"ranks=4", "clock=modelled", "link_bandwidth_gbps=" + std::to_string(gbps)});
    ASSERT_FALSE(m.is_null());
    std::vector<std::int64_t> rows(4);
    for (int r = 0; r < 4; ++r) {
      const auto groups = rank_report(m, r).at("rows_per_local_expert").get<std::vector<std::int64_t>>();
      rows[r] = std::accumulate(groups.begin(), groups.end(), std::int64_t{0});
    }
    ASSERT_EQ(rows, (std::vector<std::int64_t>{640, 320, 320, 320}));
    EXPECT_EQ(m.at("modelled").at("critical_path_rank").get<int>(), 0) << what;
    // Exact: a clock's advance is compute + communication + idle (integer
    // picoseconds, printed through doubles); ranks 1-3 charge identical
    // compute (200 home tokens each, 320 expert rows each); rank 0 more.
    for (int r = 0; r < 4; ++r) {
      const double advance = rank_modelled(m, r, "forward_seconds") + rank_modelled(m, r, "backward_seconds");
      const double parts = rank_modelled(m, r, "compute_seconds") + rank_modelled(m, r, "communication_seconds") +
                           rank_modelled(m, r, "idle_seconds");
      EXPECT_NEAR(parts, advance, 1e-12 * advance) << what << " rank " << r;
    }
    const double compute0 = rank_modelled(m, 0, "compute_seconds"), compute1 = rank_modelled(m, 1, "compute_seconds");
    EXPECT_EQ(rank_modelled(m, 2, "compute_seconds"), compute1) << what;
    EXPECT_EQ(rank_modelled(m, 3, "compute_seconds"), compute1) << what;
    const double extra_compute = compute0 - compute1;
    ASSERT_GT(extra_compute, 0) << what;
    // The others idle the compute difference. Exactly:
    //   idle_i - idle_0 = (compute_0 - compute_i) + (comm_0 - comm_i) + (T_i - T_0)
    // (T = a rank's fwd + bwd), an identity of the line above; what the test
    // holds is that the last two terms are small. They are the transfers'
    // differences: rank 0's port carries the 320 extra rows (320·64·4 =
    // 81920 B, 0.18 us at 450 GB/s) into the dispatch and out of the
    // combine (and back in backward), so at 450 GB/s part of the wait on
    // rank 0 shows as the others' idle and part as rank 0's communication:
    // |residual| <= two such serialisations (measured 0.06-0.19 us of 1.86;
    // which ranks see more depends on the order of the messages at ports).
    // At 1 PB/s those 81920 B take 82 ps and every message's latency is the
    // same 2 us. Since the combine and the backward exchange with known
    // counts (no count round: at these shapes with gen-inputs' routing the
    // modelled step is 31% shorter, 13.4 vs 19.4 us), rank 0 also waits once for its peers, less than one
    // latency: they start their backward only when rank 0's combine reaches
    // them (measured 0.64-0.87 us of idle on rank 0, and the same in the
    // residual). Both stay below one message latency.
    const double latency = 2e-6;
    const double tolerance = (gbps < 1e3 ? 2 * 81920 / (gbps * 1e9) : 1e-9) + latency;
    EXPECT_LT(rank_modelled(m, 0, "idle_seconds"), latency) << what;
    for (int r = 1; r < 4; ++r) {
      const double residual = rank_modelled(m, r, "idle_seconds") - rank_modelled(m, 0, "idle_seconds") - extra_compute;
      EXPECT_LE(std::abs(residual), tolerance)
          << what << " rank " << r << ": idle " << rank_modelled(m, r, "idle_seconds") << " s, rank 0 idle "
          << rank_modelled(m, 0, "idle_seconds") << " s, compute difference " << extra_compute << " s";
    }
  }
}

// --- 4. token chunks ---------------------------------------------------------

// Balanced routing on R = 4 ranks, E = 8: the i-th token of home rank h goes
// to ranks h+o1, h+o2 with (o1, o2) = (1,2), (2,3), (3,1) for i mod 3, and
// local expert (i/3) mod 2 on both: with chunks of a multiple of 6 tokens,
// every rank sends exactly as many rows to each peer as it receives from
// each, in every chunk (so the order in which messages meet at a port
// changes nothing), 2/3 of the chunk's tokens to each peer.
std::function<std::pair<int, int>(std::int64_t)> balanced_over_peers(std::int64_t tokens_per_rank) {
  return [tokens_per_rank](std::int64_t t) -> std::pair<int, int> {
    const int h = static_cast<int>(t / tokens_per_rank), i = static_cast<int>(t % tokens_per_rank);
    const int o1 = i % 3 + 1, o2 = (i % 3 + 1) % 3 + 1, local = (i / 3) % 2;
    return {((h + o1) % 4) * 2 + local, ((h + o2) % 4) * 2 + local};
  };
}

// Forward of a chunked layer in modelled time. With n chunks the engine
// dispatches chunk 0, then launches chunk c+1's dispatch before computing
// chunk c, and launches chunk c's combine after computing it (one chunk of
// look-ahead). When every chunk's communication fits under a chunk's compute
// (here compute is ~2x communication), only chunk 0's dispatch and the last
// chunk's combine are exposed:
//   fwd_n = C + D(n) + K(n)
// C: the forward's compute, the same for every n (every charged step is
// linear in rows: the GEMMs are compute-bound at compute_efficiency=0.05,
// the gathers and SwiGLU memory-bound in per-row bytes; only per-op
// picosecond rounding differs). D(n), K(n): one chunk's dispatch / combine
// alone, a fixed latency part plus bytes/n at the port's rate:
//   D(n) = a_D + (D_1 - a_D)/n,  K(n) = a_K + (K_1 - a_K)/n
// a_D = 2L for the all-to-all: the count exchange (the send counts), then
// the rows; a_D = L for the ring: its token-count round (one message per
// peer, posted at once) moves while chunk 0 is packed and is over before
// the all-gather is launched, and the ring's steps pipeline their latencies
// behind the serialisation; a_K = L (the counts are known). D_1, K_1, C per rank from the n=1 run
// (nothing overlaps there, so C = fwd_1 - D_1 - K_1, and C is the same on
// every rank: asserted). Per rank, not one for all: although every rank
// sends and receives the same bytes, ports serve whole messages first come
// first served, and the 8-byte count messages finish a few ps apart on
// different ranks (ties at a port go to the lower stream id), which orders
// whole 64 KiB messages differently at each port: D_1, K_1 differ between
// ranks by up to two message serialisations (~0.3 us), consistently for
// every n. What remains is the serialisation of the count messages (8 B per
// peer, ~0.02 ns each at 450 GB/s) and per-op rounding: tolerance 1 ns
// (measured <= 0.05 ns) against a gain of ~1.3 us at n=2. (It takes D_1
// from the one-chunk run under the same charges, so it cannot tell when a
// chunk's packing is charged: ChunkPipelineFollowsTheLinkAndComputeRules
// below does.)
TEST_F(ModelledLayer, TokenChunksPipelineAsTheFormulaSays) {
  const std::filesystem::path in = dir("in");
  constexpr int kRanks = 4;
  constexpr std::int64_t kTokensPerRank = 192;  // 4 chunks of 48 = 8 blocks of 6
  generate(in, {.tokens = kRanks * kTokensPerRank, .hidden = 128, .ffn = 512, .experts = 8});
  craft_routing(in, balanced_over_peers(kTokensPerRank));
  for (const std::string dispatch : {"alltoall", "ring"}) {
    std::vector<double> c(kRanks), d1(kRanks), k1(kRanks), fwd1(kRanks);
    double compute1 = 0;
    for (int n : {1, 2, 4}) {
      const std::string what = dispatch + " token_chunks=" + std::to_string(n);
      const std::filesystem::path trace = dir("chunks_" + dispatch + std::to_string(n) + ".json");
      const nlohmann::json m =
          layer_metrics(in, {"ranks=4", "clock=modelled", "dispatch=" + dispatch, "token_chunks=" + std::to_string(n),
                             "compute_efficiency=0.05", "link_latency_us=0.001", "trace_file=" + trace.string()});
      ASSERT_FALSE(m.is_null()) << what;
      const nlohmann::json events = check_trace_structure(trace, 1e-6, what);
      const double latency = m.at("modelled").at("links").at("latency_us").get<double>() * 1e-6;
      ASSERT_EQ(latency, 1e-9);
      const double a_d = dispatch == "ring" ? latency : 2 * latency, a_k = latency;
      for (int r = 0; r < kRanks; ++r) {
        const double fwd = rank_modelled(m, r, "forward_seconds");
        if (n == 1) {
          // The forward's collectives: the dispatch's (from the first
          // launch to the last end but the combine's) and the combine, which
          // ends last.
          double first_start = INFINITY, dispatch_end = 0, combine = 0, last_end = 0;
          int forward_collectives = 0;
          for (const nlohmann::json& col : rank_report(m, r).at("modelled").at("collectives")) {
            const double start = col.at("start_seconds").get<double>(), end = col.at("end_seconds").get<double>();
            if (start >= fwd) continue;
            ++forward_collectives;
            first_start = std::min(first_start, start);
            // The combine ends last; the home side's sum of its rows
            // ("combine home sum", "unpack rows") follows it in C.
            if (end > last_end) {
              dispatch_end = std::max(dispatch_end, last_end);
              last_end = end;
              combine = end - start;
            } else {
              dispatch_end = std::max(dispatch_end, end);
            }
          }
          ASSERT_GE(forward_collectives, 2) << what;
          ASSERT_GT(combine, 0) << what << ": no combine in the forward";
          d1[r] = dispatch_end - first_start;
          k1[r] = combine;
          fwd1[r] = fwd;
          c[r] = fwd - d1[r] - k1[r];
          if (r == 0) compute1 = rank_modelled(m, 0, "compute_seconds");
          EXPECT_NEAR(rank_modelled(m, r, "compute_seconds"), compute1, 1e-12) << what << " rank " << r;
          EXPECT_NEAR(c[r], c[0], 1e-12) << what << " rank " << r;
          continue;
        }
        // Charged steps that the chunks place differently from one chunk
        // (docs/MODELLED_TIME.md): the backward adds chunk c > 0's weight
        // gradient into the total ("accumulate weight gradients"); a
        // chunk's tokens are packed ("token encode", E in all) right before
        // its exchange is launched: for the all-to-all that is its first
        // collective, so the packing is in C; the ring launches its count
        // round before chunk 0's packing, so at n = 1 the packing is inside
        // D_1, and with n chunks only chunk 0's E/n stays in the dispatch,
        // chunks 1..n-1's on the compute path: E (n-1)/n more. And the home
        // side's sums of the returned rows (S), done chunk by chunk after
        // the forward's last launch, overlap the last chunk's combine for
        // chunks 0..n-2 (they start when it is launched): the last
        // combine's K(n) becomes max(K(n), S (n-1)/n) - S (n-1)/n.
        const double accumulate = traced_seconds(events, r, "accumulate weight gradients", INFINITY);
        EXPECT_NEAR(rank_modelled(m, r, "compute_seconds") - accumulate, compute1, 1e-9) << what << " rank " << r;
        const double encode = traced_seconds(events, r, "token encode", fwd);
        const double home_sums =
            traced_seconds(events, r, "combine home sum", fwd) + traced_seconds(events, r, "unpack rows", fwd);
        const double overlapped = home_sums * (n - 1) / n, k_n = a_k + (k1[r] - a_k) / n;
        const double packing_moved = dispatch == "ring" ? encode * (n - 1) / n : 0;
        const double predicted =
            c[r] + a_d + (d1[r] - a_d) / n + packing_moved + std::max(k_n, overlapped) - overlapped;
        EXPECT_NEAR(fwd, predicted, 1e-9)
            << what << " rank " << r << ": C " << c[r] << " D_1 " << d1[r] << " K_1 " << k1[r];
        EXPECT_LT(fwd, fwd1[r] - 0.4 * (d1[r] + k1[r])) << what << ": chunking hides communication";
      }
    }
  }
}

// The same pipeline on shapes of its own, where communication does not
// (all) hide under compute, against its makespan written from the model's
// rules (chunk_pipeline.h): one link direction's FCFS schedule, the rank's
// program and each collective's (the ring's count round, all-gather lanes
// and reduce-scatter steps included), for both dispatchers. The formula
// above assumes every chunk's exchange fits under a chunk's compute and was
// off by up to 69% elsewhere. Three regimes, chosen with the link_* keys and
// compute_efficiency (checked, not assumed: what one link carries of a
// chunk's tokens against its expert compute): compute-bound,
// communication-bound, mixed. Within 1 ns (0.01-0.1% of these forwards;
// rounding to picoseconds per operation and message is far below it): at
// 1%, an exchange launched before its tokens were packed passed (all-to-all
// 0.1-0.8% here; the ring, whose all-gather was launched before its packing
// was charged until ring30: 11-46 ns, 0.1-0.2%).
TEST_F(ModelledLayer, ChunkPipelineFollowsTheLinkAndComputeRules) {
  struct Shape {
    std::string regime;
    std::int64_t tokens_per_rank, hidden, ffn;
    int chunks;
    double efficiency, gbps, latency_us;
    double min_ratio, max_ratio;  // a chunk's token bytes on one link / bandwidth / its expert compute
  };
  const std::vector<Shape> shapes = {
      {"compute-bound", 144, 96, 384, 3, 0.02, 200, 0.3, 0, 0.5},
      {"communication-bound", 120, 160, 64, 4, 0.5, 8, 1.5, 2, INFINITY},
      {"mixed", 96, 48, 224, 2, 0.05, 40, 0.7, 0.5, 2},
  };
  for (const Shape& shape : shapes) {
    ASSERT_EQ(shape.tokens_per_rank % (6 * shape.chunks), 0) << shape.regime << ": balanced_over_peers needs it";
    const std::filesystem::path in = dir("in_" + shape.regime);
    generate(in, {.tokens = 4 * shape.tokens_per_rank, .hidden = shape.hidden, .ffn = shape.ffn, .experts = 8});
    craft_routing(in, balanced_over_peers(shape.tokens_per_rank));
    std::ostringstream gbps, latency, efficiency;
    gbps << shape.gbps;
    latency << shape.latency_us;
    efficiency << shape.efficiency;
    for (const std::string dispatch : {"alltoall", "ring"}) {
      const std::string what = dispatch + " " + shape.regime + " H=" + std::to_string(shape.hidden) +
                               " F=" + std::to_string(shape.ffn) + " N_l=" + std::to_string(shape.tokens_per_rank) +
                               " chunks=" + std::to_string(shape.chunks);
      const std::filesystem::path trace = dir("pipeline_" + dispatch + shape.regime + ".json");
      const nlohmann::json m =
          layer_metrics(in, {"ranks=4", "clock=modelled", "dispatch=" + dispatch, "link_topology=full_mesh",
                             "token_chunks=" + std::to_string(shape.chunks), "link_bandwidth_gbps=" + gbps.str(),
                             "link_latency_us=" + latency.str(), "compute_efficiency=" + efficiency.str(),
                             "trace_file=" + trace.string()});
      ASSERT_FALSE(m.is_null()) << what;
      const nlohmann::json events = check_trace_structure(trace, 1e-6, what);
      const nlohmann::json& used = m.at("modelled").at("links");
      ASSERT_EQ(used.at("topology"), "full_mesh") << what;
      const double chunk_tokens = static_cast<double>(shape.tokens_per_rank / shape.chunks);
      const double h = static_cast<double>(shape.hidden);
      ChunkLinks links{.bytes_per_second = used.at("bandwidth_gb_per_s").get<double>() * 1e9,
                       .latency_seconds = used.at("latency_us").get<double>() * 1e-6,
                       .num_ranks = 4};
      if (dispatch == "alltoall") {
        // Per peer and chunk: 2/3 of the chunk's tokens, one (expert,
        // weight) entry each (the two experts are on different ranks): 3
        // routing words + an f32 row out, an f32 row back.
        links.token_bytes = 2.0 * chunk_tokens / 3.0 * (12.0 + 4.0 * h);
        links.combine_bytes = 2.0 * chunk_tokens / 3.0 * 4.0 * h;
      } else {
        // Per lane and chunk: half a block - the chunk's tokens with K = 2
        // destinations and weights (16 bytes) and an f32 row each; half
        // the chunk's f32 partial sums.
        links.token_bytes = chunk_tokens * (16.0 + 4.0 * h) / 2;
        links.combine_bytes = chunk_tokens * 4.0 * h / 2;
      }
      // What crosses one link per chunk: the all-to-all's token message, the
      // ring's R-1 steps of its lane.
      const double link_bytes = dispatch == "alltoall" ? links.token_bytes : 3 * links.token_bytes;
      for (int r = 0; r < 4; ++r) {
        const double fwd = rank_modelled(m, r, "forward_seconds");
        const ChunkStages stages =
            chunk_stages(events, r, fwd, shape.chunks, dispatch == "alltoall" ? "combine home sum" : "unpack rows");
        const double ratio = link_bytes / links.bytes_per_second / stages.experts[0];
        EXPECT_GE(ratio, shape.min_ratio) << what << " rank " << r << ": not the regime it names";
        EXPECT_LE(ratio, shape.max_ratio) << what << " rank " << r << ": not the regime it names";
        const double predicted =
            dispatch == "alltoall" ? alltoall_chunked_forward(stages, links) : ring_chunked_forward(stages, links);
        EXPECT_NEAR(fwd, predicted, 1e-9) << what << " rank " << r << " (payload/compute " << ratio << ")";
        if (r == 0)
          std::printf("%s: forward %.6f us, formula %.6f us, payload/compute %.3f\n", what.c_str(), fwd * 1e6,
                      predicted * 1e6, ratio);
      }
    }
  }
}

// --- 6. scale ----------------------------------------------------------------

TEST_F(ModelledLayer, SixtyFourRanksComplete) {
  const std::filesystem::path in = dir("in");
  generate(in, {.tokens = 1024, .hidden = 16, .ffn = 16, .experts = 64});
  const auto start = std::chrono::steady_clock::now();
  const nlohmann::json m = layer_metrics(in, {"ranks=64", "clock=modelled"});
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("ranks=64 modelled layer: %.2f s wall\n", wall);
  ASSERT_FALSE(m.is_null());
  EXPECT_GT(m.at("modelled").at("step_seconds").get<double>(), 0);
  ASSERT_EQ(m.at("modelled").at("per_rank").size(), 64u);
  for (int r = 0; r < 64; ++r) {
    EXPECT_GT(rank_modelled(m, r, "forward_seconds"), 0) << r;
    EXPECT_GT(rank_modelled(m, r, "backward_seconds"), 0) << r;
    EXPECT_GT(rank_modelled(m, r, "compute_seconds"), 0) << r;
    EXPECT_GT(rank_modelled(m, r, "communication_seconds"), 0) << r;
  }
}

}  // namespace
}  // namespace epmoe::testing
