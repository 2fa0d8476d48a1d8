// Shared by the end-to-end tests of clock=modelled and trace_file= (the
// `epmoe` binary as a subprocess, ranks as threads): inputs from
// `epmoe gen-inputs`, optionally with crafted routing (each token's K=2
// experts chosen by the test), `epmoe layer` runs returning metrics.json, and
// the structural checks of a Chrome trace file.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/npy.h"
#include "epmoe_cli_fixture.h"

namespace epmoe::testing {

struct LayerDims {
  std::int64_t tokens = 0, hidden = 0, ffn = 0, experts = 0;
};

class ModelledCli : public ::testing::Test {
 protected:
  std::filesystem::path dir(const std::string& name) const { return scratch_ / name; }

  void generate(const std::filesystem::path& in, const LayerDims& d, std::vector<std::string> extra = {}) {
    std::vector<std::string> arguments = {"gen-inputs",
                                          "--out",
                                          in.string(),
                                          "num_tokens=" + std::to_string(d.tokens),
                                          "hidden=" + std::to_string(d.hidden),
                                          "ffn=" + std::to_string(d.ffn),
                                          "num_experts=" + std::to_string(d.experts)};
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    const ProcessResult result = run_epmoe(scratch_, arguments);
    ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  }

  // Rewrites x.npy and gate.npy so that softmax_topk with K=2 routes token t
  // to exactly the two distinct experts experts_of(t): gate[j][e] = 4·[j==e]
  // for j < E and 0 for j >= E, and x[t][j] = [j is one of t's experts] for
  // j < E (columns >= E keep their random values, which the gate ignores).
  // Logits are 4 for the two experts and 0 for every other: no near ties.
  // Needs hidden >= num_experts.
  void craft_routing(const std::filesystem::path& in,
                     const std::function<std::pair<int, int>(std::int64_t)>& experts_of) {
    Tensor x = read_npy(in / "x.npy", DType::f32);
    Tensor gate = read_npy(in / "gate.npy", DType::f32);
    const std::int64_t n = x.dim(0), h = x.dim(1), e = gate.dim(1);
    ASSERT_GE(h, e) << "craft_routing needs hidden >= num_experts";
    float* g = gate.data<float>();
    for (std::int64_t j = 0; j < h; ++j)
      for (std::int64_t k = 0; k < e; ++k) g[j * e + k] = (j < e && j == k) ? 4.0f : 0.0f;
    float* xs = x.data<float>();
    for (std::int64_t t = 0; t < n; ++t) {
      const auto [a, b] = experts_of(t);
      ASSERT_NE(a, b);
      for (std::int64_t j = 0; j < e; ++j) xs[t * h + j] = (j == a || j == b) ? 1.0f : 0.0f;
    }
    write_npy(in / "x.npy", x);
    write_npy(in / "gate.npy", gate);
  }

  // `epmoe layer` with threads=1; the run must succeed.
  ProcessResult layer(const std::filesystem::path& in, const std::filesystem::path& out,
                      const std::vector<std::string>& keys) {
    std::vector<std::string> arguments = {"layer", "--in", in.string(), "--out", out.string(), "threads=1"};
    arguments.insert(arguments.end(), keys.begin(), keys.end());
    return run_epmoe(scratch_, arguments);
  }

  // A successful run's metrics.json (a fresh --out each call); null on failure.
  nlohmann::json layer_metrics(const std::filesystem::path& in, const std::vector<std::string>& keys) {
    const std::filesystem::path out = scratch_ / ("out" + std::to_string(next_out_++));
    const ProcessResult result = layer(in, out, keys);
    EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
    if (result.exit_code != 0) return nullptr;
    return read_metrics(out);
  }

  ScratchDir scratch_;
  int next_out_ = 0;
};

// modelled.per_rank[r][field] and expert_parallel.per_rank[r].modelled.
inline double rank_modelled(const nlohmann::json& metrics, int rank, const std::string& field) {
  return metrics.at("modelled").at("per_rank").at(static_cast<std::size_t>(rank)).at(field).get<double>();
}

inline const nlohmann::json& rank_report(const nlohmann::json& metrics, int rank) {
  return metrics.at("expert_parallel").at("per_rank").at(static_cast<std::size_t>(rank));
}

// The structure every trace must have: {"traceEvents": [...]}, every event
// with name, ph, ts, pid, tid (and dur >= 0 for ph X), and the complete
// events of each (pid, tid) track properly nested: sorted by (ts, longest
// first), each either contains the next or ends at or before its start
// (`slack_us` absorbs the printing of times through 15 significant digits).
// Returns the events.
inline nlohmann::json check_trace_structure(const std::filesystem::path& path, double slack_us,
                                            const std::string& what) {
  nlohmann::json trace;
  try {
    trace = nlohmann::json::parse(read_bytes(path));
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": " << path << " does not parse as JSON: " << e.what();
    return nlohmann::json::array();
  }
  EXPECT_TRUE(trace.is_object()) << what;
  if (!trace.is_object() || !trace.contains("traceEvents")) {
    ADD_FAILURE() << what << ": no traceEvents";
    return nlohmann::json::array();
  }
  const nlohmann::json& events = trace.at("traceEvents");
  EXPECT_TRUE(events.is_array()) << what;
  EXPECT_GT(events.size(), 0u) << what;
  struct Span {
    double begin, end;
    std::string name;
  };
  std::map<std::pair<int, int>, std::vector<Span>> tracks;
  int malformed = 0;
  for (const nlohmann::json& e : events) {
    bool ok = true;
    for (const char* key : {"name", "ph", "ts", "pid", "tid"}) ok = ok && e.contains(key);
    if (!ok || !e.at("name").is_string() || !e.at("ph").is_string() || !e.at("ts").is_number() ||
        !e.at("pid").is_number_integer() || !e.at("tid").is_number_integer()) {
      if (++malformed <= 3) ADD_FAILURE() << what << ": malformed event " << e.dump();
      continue;
    }
    if (e.at("ph") != "X") continue;
    if (!e.contains("dur") || !e.at("dur").is_number()) {
      if (++malformed <= 3) ADD_FAILURE() << what << ": complete event without dur " << e.dump();
      continue;
    }
    const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
    if (dur < 0 && ++malformed <= 3) ADD_FAILURE() << what << ": negative duration " << e.dump();
    tracks[{e.at("pid").get<int>(), e.at("tid").get<int>()}].push_back({ts, ts + dur, e.at("name").get<std::string>()});
  }
  EXPECT_EQ(malformed, 0) << what;
  int overlaps = 0;
  for (auto& [track, spans] : tracks) {
    std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
    });
    std::vector<const Span*> open;  // enclosing spans, innermost last
    for (const Span& s : spans) {
      while (!open.empty() && open.back()->end <= s.begin + slack_us) open.pop_back();
      if (!open.empty() && s.end > open.back()->end + slack_us && ++overlaps <= 3) {
        ADD_FAILURE() << what << ": pid " << track.first << " tid " << track.second << ": '" << s.name << "' ["
                      << s.begin << ", " << s.end << "] overlaps '" << open.back()->name << "' [" << open.back()->begin
                      << ", " << open.back()->end << "] without nesting";
      }
      open.push_back(&s);
    }
  }
  EXPECT_EQ(overlaps, 0) << what;
  return events;
}

}  // namespace epmoe::testing
