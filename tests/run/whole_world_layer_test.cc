// The whole-world layer (<epmoe/whole_world_layer.h>) kept between calls:
// its rank threads and every rank's group and layer live from call to call,
// so calls must stay independent of each other:
//  * repeated calls give the same bits, and a layer made anew for each call
//    gives them too;
//  * a call on other shapes rebuilds the ranks and gives that shape's bits;
//  * a call refused up front (a NaN) or failed inside one rank (an injected
//    fault with its exchange in flight) is reported, and the next call runs
//    (on a fresh world after a rank failed) with the right bits;
//  * the dgate written is the ranks' parts summed, not a leftover of an
//    earlier call;
//  * fewer tokens than ranks (N = 0, 1, R-1: ranks holding no rows) run to
//    the end on both dispatchers and match the one-rank call (issue 28 N3:
//    a rank with no rows skipped a collective the others ran, and the run
//    hung until comm_timeout_ms);
//  * fault_injection= and trace_file= belong to the layer given them.
// Ranks: threads (R = 1..4); arrays from a seeded generator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <epmoe/error.h>
#include <epmoe/whole_world_layer.h>

#include <nlohmann/json.hpp>

#include "core/fault_injection.h"  // InjectedFault
#include "data/test_files.h"

namespace epmoe {
namespace {

struct Arrays {
  Arrays(std::int64_t n, std::int64_t h, std::int64_t f, std::int64_t e, int k, unsigned seed)
      : n(n), h(h), f(f), e(e), k(k) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    for (std::vector<float>* v : {&x, &gate, &wi0, &wi1, &wo, &dy}) {
      v->resize(v == &x || v == &dy ? n * h : v == &gate ? h * e : e * h * f);
      for (float& value : *v) value = normal(rng);
    }
  }
  std::int64_t n, h, f, e;
  int k;
  std::vector<float> x, gate, wi0, wi1, wo, dy;

  LayerArrays views() const {
    return {.x = TensorView(x.data(), {n, h}),
            .gate = TensorView(gate.data(), {h, e}),
            .wi0 = TensorView(wi0.data(), {e, h, f}),
            .wi1 = TensorView(wi1.data(), {e, h, f}),
            .wo = TensorView(wo.data(), {e, f, h}),
            .dy = TensorView(dy.data(), {n, h})};
  }
};

// Every output of one call, as bytes.
struct Outputs {
  explicit Outputs(const Arrays& a)
      : y(a.n * a.h),
        ids(a.n * a.k),
        weights(a.n * a.k),
        dx(a.n * a.h),
        dgate(a.h * a.e),
        dwi0(a.e * a.h * a.f),
        dwi1(a.e * a.h * a.f),
        dwo(a.e * a.f * a.h) {
    // Garbage first: a call must write every element.
    for (std::vector<float>* v : {&y, &weights, &dx, &dgate, &dwi0, &dwi1, &dwo})
      std::fill(v->begin(), v->end(), std::numeric_limits<float>::quiet_NaN());
  }
  LayerOutputs views(const Arrays& a) {
    return {.y = MutableTensorView(y.data(), {a.n, a.h}),
            .topk_ids = MutableTensorView(ids.data(), {a.n, a.k}),
            .topk_weights = MutableTensorView(weights.data(), {a.n, a.k}),
            .dx = MutableTensorView(dx.data(), {a.n, a.h}),
            .dgate = MutableTensorView(dgate.data(), {a.h, a.e}),
            .dwi0 = MutableTensorView(dwi0.data(), {a.e, a.h, a.f}),
            .dwi1 = MutableTensorView(dwi1.data(), {a.e, a.h, a.f}),
            .dwo = MutableTensorView(dwo.data(), {a.e, a.f, a.h})};
  }
  bool operator==(const Outputs& o) const {
    const auto same = [](const auto& a, const auto& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    return same(y, o.y) && same(ids, o.ids) && same(weights, o.weights) && same(dx, o.dx) && same(dgate, o.dgate) &&
           same(dwi0, o.dwi0) && same(dwi1, o.dwi1) && same(dwo, o.dwo);
  }
  std::vector<float> y;
  std::vector<std::int32_t> ids;
  std::vector<float> weights, dx, dgate, dwi0, dwi1, dwo;
};

Outputs call(WholeWorldLayer& layer, const Arrays& a) {
  Outputs out(a);
  layer.run(a.views(), out.views(a));
  return out;
}

TEST(WholeWorldLayer, CallsKeepTheirBitsAcrossShapesAndAfterAFailure) {
  const Arrays small(30, 16, 12, 6, 2, 1), other(41, 24, 20, 6, 2, 2);
  for (const std::map<std::string, std::string>& keys :
       {std::map<std::string, std::string>{{"ranks", "1"}},
        std::map<std::string, std::string>{{"ranks", "3"}, {"dispatch", "alltoall"}, {"dedup", "true"}},
        std::map<std::string, std::string>{{"ranks", "3"}, {"dispatch", "ring"}, {"token_chunks", "2"}},
        std::map<std::string, std::string>{{"ranks", "3"}, {"balance", "dynamic"}, {"redundant_slots", "1"}}}) {
    SCOPED_TRACE(keys.at("ranks") + (keys.count("dispatch") ? " " + keys.at("dispatch") : std::string()) +
                 (keys.count("balance") ? " replicas" : ""));
    // Each layer made for one call: the reference bits.
    WholeWorldLayer fresh_small(keys), fresh_other(keys);
    const Outputs want_small = call(fresh_small, small), want_other = call(fresh_other, other);

    WholeWorldLayer kept(keys);
    EXPECT_TRUE(call(kept, small) == want_small) << "first call";
    EXPECT_TRUE(call(kept, small) == want_small) << "second call on the same arrays";
    EXPECT_TRUE(call(kept, other) == want_other) << "a call on other shapes";
    EXPECT_TRUE(call(kept, small) == want_small) << "back to the first shapes";

    // A NaN in the arrays is refused before any rank runs, naming it.
    Arrays bad = small;
    bad.x[15 * small.h + 3] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_THROW(call(kept, bad), NumericError);
    EXPECT_TRUE(call(kept, small) == want_small) << "the call after a refused one";

    // The last rank fails inside its dispatch, with its exchange in flight
    // and its group built (the world is aborted: every rank ends); the next
    // call runs on a fresh world and its ranks are built anew, with the
    // right bits.
    const int last = std::stoi(keys.at("ranks")) - 1;
    if (last == 0) continue;  // one rank: nothing to dispatch, no point to fail at
    std::map<std::string, std::string> failing_keys = keys;
    failing_keys["fault_injection"] = std::to_string(last) + ":dispatch:throw";
    WholeWorldLayer failing(failing_keys);
    EXPECT_THROW(call(failing, small), InjectedFault);
    EXPECT_TRUE(call(failing, small) == want_small) << "the call after a rank failed";
  }
}

// fault_injection= belongs to the layer given it, its count too: another
// layer of the process never fails with it. Before, the spec was
// process-wide: set by the faulty layer's first call, its second hit was the
// clean layer's next call. R = 2, forward only (one dispatch per call and
// rank).
TEST(WholeWorldLayer, AnotherLayersFaultInjectionNeverFailsThisLayer) {
  const Arrays small(30, 16, 12, 6, 2, 1);
  const std::map<std::string, std::string> keys = {{"ranks", "2"}, {"threads", "2"}};
  const auto forward = [&](WholeWorldLayer& layer) {
    Outputs out(small);
    LayerArrays arrays = small.views();
    arrays.dy = {};
    const LayerOutputs all = out.views(small);
    layer.run(arrays, {.y = all.y, .topk_ids = all.topk_ids, .topk_weights = all.topk_weights});
    return out.y;
  };
  WholeWorldLayer clean(keys);
  const std::vector<float> want = forward(clean);
  std::map<std::string, std::string> faulty_keys = keys;
  faulty_keys["fault_injection"] = "1:dispatch:throw:2";  // the faulty layer's own 2nd call
  WholeWorldLayer faulty(faulty_keys);
  for (int call = 1; call <= 3; ++call) {
    if (call == 2) {
      EXPECT_THROW(forward(faulty), InjectedFault) << "the faulty layer's call " << call;
    } else {
      EXPECT_NO_THROW(forward(faulty)) << "the faulty layer's call " << call;
    }
    std::vector<float> got;
    EXPECT_NO_THROW(got = forward(clean)) << "the clean layer after the faulty one's call " << call;
    EXPECT_EQ(got, want) << "the clean layer after the faulty one's call " << call;
  }
}

// ACTION stop on ranks as threads stops that rank's thread only (before:
// SIGSTOP to the whole process, which never woke). Its peer times out after
// comm_timeout_ms, and the call fails naming the stopped rank; the next call
// runs on a fresh world.
TEST(WholeWorldLayer, AStoppedRankOnThreadsFailsTheCallNamingIt) {
  const Arrays small(30, 16, 12, 6, 2, 1);
  const std::map<std::string, std::string> keys = {{"ranks", "2"}, {"threads", "2"}, {"comm_timeout_ms", "300"}};
  WholeWorldLayer clean(keys);
  const Outputs want = call(clean, small);
  std::map<std::string, std::string> stopping_keys = keys;
  stopping_keys["fault_injection"] = "1:dispatch:stop";
  WholeWorldLayer stopping(stopping_keys);
  try {
    call(stopping, small);
    ADD_FAILURE() << "no failure";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 had stopped at dispatch (fault_injection=1:dispatch:stop)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(call(stopping, small) == want) << "the call after the stopped one";
}

// trace_file= is this layer's: each successful call writes its timeline
// there (before: the key was accepted and nothing written); a path that
// cannot be written is refused at construction, leaving nothing.
TEST(WholeWorldLayer, TraceFileIsWrittenByEachCallOrRefusedUpFront) {
  const testing::ScratchDir scratch;
  const Arrays small(30, 16, 12, 6, 2, 1);
  const std::filesystem::path trace = scratch / "trace.json";
  WholeWorldLayer layer({{"ranks", "2"}, {"threads", "2"}, {"trace_file", trace.string()}});
  call(layer, small);
  const nlohmann::json events = nlohmann::json::parse(testing::read_bytes(trace))["traceEvents"];
  std::set<int> ranks;
  for (const nlohmann::json& event : events)
    if (event["ph"] == "X") ranks.insert(event["pid"].get<int>());
  EXPECT_EQ(ranks, (std::set<int>{0, 1})) << "both ranks' timelines";

  std::filesystem::create_directory(scratch / "dir");
  try {
    WholeWorldLayer refused({{"ranks", "2"}, {"trace_file", (scratch / "dir").string()}});
    ADD_FAILURE() << "a directory accepted as trace_file";
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find("trace_file=" + (scratch / "dir").string() + ": is a directory"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(testing::directory_entries(scratch.path()), (std::set<std::string>{"dir", "trace.json"})) << "left behind";
}

// With one rank nobody could notice a stop: refused up front.
TEST(WholeWorldLayer, AStopWithOneRankIsRefused) {
  try {
    WholeWorldLayer layer({{"ranks", "1"}, {"fault_injection", "0:dispatch:stop"}});
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fault_injection=0:dispatch:stop: stop needs ranks >= 2"), std::string::npos)
        << e.what();
  }
}

// max |got - want| / max |want|, over one output (DESIGN.md §3).
template <typename T>
double relative_error(const std::vector<T>& got, const std::vector<T>& want) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

TEST(WholeWorldLayer, FewerTokensThanRanksMatchTheOneRankCall) {
  // Not the one-rank bits: the router's GEMM rounds 1 row and 2 rows
  // differently (topk_weights differ by ~2e-7 at R=3, N=2), so within
  // DESIGN.md §3's 1e-5 of it; a rank that skipped a collective would time
  // out (2 s, not the default minute) and throw instead.
  const std::map<std::string, std::string> variants[] = {
      {{"dispatch", "alltoall"}},
      {{"dispatch", "alltoall"}, {"dedup", "true"}, {"token_chunks", "2"}},
      {{"dispatch", "ring"}},
      {{"dispatch", "ring"}, {"token_chunks", "2"}},
  };
  // Per R: the one-rank outputs of each token count, then one kept layer
  // per variant called on each (a new shape rebuilds its ranks, not its
  // threads: the test stays fast).
  WholeWorldLayer one_rank(std::map<std::string, std::string>{{"ranks", "1"}});
  for (int num_ranks : {2, 3, 4}) {
    std::vector<Arrays> inputs;
    std::vector<Outputs> wanted;
    for (std::int64_t num_tokens = 0; num_tokens < num_ranks; num_tokens = num_tokens == 0 ? 1 : num_ranks - 1) {
      inputs.emplace_back(num_tokens, 8, 6, 12, 2, 40 + num_ranks);
      wanted.push_back(call(one_rank, inputs.back()));
      if (num_tokens == num_ranks - 1) break;
    }
    for (std::map<std::string, std::string> keys : variants) {
      keys["ranks"] = std::to_string(num_ranks);
      keys["comm_timeout_ms"] = "2000";
      WholeWorldLayer layer(keys);
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        const Arrays& a = inputs[i];
        const Outputs& want = wanted[i];
        std::string what = "N=" + std::to_string(a.n);
        for (const auto& [key, value] : keys) what += " " + key + "=" + value;
        SCOPED_TRACE(what);
        Outputs got(a);
        ASSERT_NO_THROW(layer.run(a.views(), got.views(a)));
        EXPECT_EQ(got.ids, want.ids);
        EXPECT_LE(relative_error(got.y, want.y), 1e-5);
        EXPECT_LE(relative_error(got.weights, want.weights), 1e-5);
        EXPECT_LE(relative_error(got.dx, want.dx), 1e-5);
        EXPECT_LE(relative_error(got.dgate, want.dgate), 1e-5);
        EXPECT_LE(relative_error(got.dwi0, want.dwi0), 1e-5);
        EXPECT_LE(relative_error(got.dwi1, want.dwi1), 1e-5);
        EXPECT_LE(relative_error(got.dwo, want.dwo), 1e-5);
      }
    }
  }
}

}  // namespace
}  // namespace epmoe
