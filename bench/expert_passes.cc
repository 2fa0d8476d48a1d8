// bench_expert_passes: where the local experts' forward and backward
// (moe/local_experts.cc) spend their time at the single-rank layer's shape
// (bench_moe_layer's defaults: 2048 tokens, top 2 of 16 experts, H=1024,
// F=512, so 4096 rows, ~256 per expert), 1 thread (issue 29).
//
// Each round calls experts_forward and experts_backward as the layer does
// (a new weight version per round, as in training) under a trace recorder,
// and reads each pass off the trace: the kernels' ComputeScope events
// (core/modelled_clock.h), consecutive events of one name merged into one
// pass (a grouped product is one event per group; two grouped products in a
// row with the same name show as one pass of twice the groups), plus the
// time between passes. In the same round every product is called alone on
// the same shapes, twice, the second call timed (its operands warm in
// cache, its weight forms prepared), and the FMA loop runs: each figure is
// the minimum over the rounds, GFLOP/s as a fraction of the best FMA loop.
//
//   bench_expert_passes [--rounds N] [--tokens N]
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench_harness.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "core/threading.h"
#include "core/trace_recorder.h"
#include "fma_peak.h"
#include "kernels/concatenated_weights.h"
#include "kernels/grouped_gemm.h"
#include "moe/local_experts.h"

namespace epmoe {
namespace {

constexpr std::int64_t kHidden = 1024, kFfn = 512;
constexpr int kExperts = 16, kTopK = 2;

Tensor random_tensor(std::vector<std::int64_t> shape, std::uint64_t seed, float scale) {
  Tensor t(DType::f32, std::move(shape));
  Rng rng(seed);
  for (float& v : t.span<float>()) v = rng.uniform(-scale, scale);
  return t;
}

// Rows as the dispatcher delivers them to one rank holding every expert:
// each token's top-k distinct experts drawn uniformly (a random router's
// loads), rows sorted by expert, each row adding into its token's slot.
ep::ExpertRows layer_rows(std::int64_t tokens) {
  Rng rng(29);
  std::vector<std::vector<std::int64_t>> tokens_of(kExperts);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::int64_t first = static_cast<std::int64_t>(rng.uniform_int(kExperts));
    std::int64_t second = static_cast<std::int64_t>(rng.uniform_int(kExperts - 1));
    if (second >= first) ++second;
    tokens_of[first].push_back(t);
    tokens_of[second].push_back(t);
  }
  ep::ExpertRows rows;
  rows.num_slots = tokens;
  for (const auto& expert_tokens : tokens_of) {
    rows.group_sizes.push_back(static_cast<std::int64_t>(expert_tokens.size()));
    for (std::int64_t t : expert_tokens) {
      rows.slot_of_row.push_back(t);
      rows.weights.push_back(rng.uniform(0.1f, 0.9f));
    }
  }
  rows.x = random_tensor({rows.num_rows(), kHidden}, 1, 1.0f);
  return rows;
}

struct TraceEvent {
  std::string name;
  double begin_us, duration_us;
};

// The compute events of a trace file, in order of their start (the
// recorder writes one event per line).
std::vector<TraceEvent> read_trace(const std::string& path) {
  std::ifstream in(path);
  std::vector<TraceEvent> events;
  for (std::string line; std::getline(in, line);) {
    const auto name_at = line.find("{\"name\":\""), ts_at = line.find("\"ts\":"), dur_at = line.find("\"dur\":");
    if (name_at == std::string::npos || dur_at == std::string::npos || ts_at == std::string::npos) continue;
    const std::size_t name_begin = name_at + 9;
    events.push_back({line.substr(name_begin, line.find('"', name_begin) - name_begin),
                      std::atof(line.c_str() + ts_at + 5), std::atof(line.c_str() + dur_at + 6)});
  }
  std::sort(events.begin(), events.end(),
            [](const TraceEvent& a, const TraceEvent& b) { return a.begin_us < b.begin_us; });
  return events;
}

// A pass: a run of consecutive events of one name, from the first's start
// to the last's end; `before_us` the time since the previous pass ended.
struct Pass {
  std::string name;
  int events = 0;
  double span_us = 0, before_us = 0;
};

std::vector<Pass> passes_of(const std::vector<TraceEvent>& events, double call_begin_us) {
  std::vector<Pass> passes;
  double previous_end = call_begin_us, pass_begin = 0;
  for (const TraceEvent& e : events) {
    if (passes.empty() || passes.back().name != e.name) {
      passes.push_back({e.name, 0, 0, e.begin_us - previous_end});
      pass_begin = e.begin_us;
    }
    passes.back().events += 1;
    previous_end = e.begin_us + e.duration_us;
    passes.back().span_us = previous_end - pass_begin;
  }
  return passes;
}

// One call traced: its passes and its wall time.
struct TracedCall {
  std::vector<Pass> passes;
  double total_us = 0;
};

TracedCall traced(const std::function<void()>& call, const std::string& path) {
  TraceRecorder recorder;
  const TraceTrack previous = set_this_thread_trace_track({&recorder, 0});
  const double begin = recorder.wall_now_us();
  call();
  const double end = recorder.wall_now_us();
  set_this_thread_trace_track(previous);
  recorder.write(path);
  return {passes_of(read_trace(path), begin), end - begin};
}

// Elementwise minimum over rounds (the passes of every round come in the
// same order with the same names).
void keep_minimum(TracedCall& best, const TracedCall& round) {
  if (best.passes.empty()) {
    best = round;
    return;
  }
  best.total_us = std::min(best.total_us, round.total_us);
  for (std::size_t i = 0; i < best.passes.size() && i < round.passes.size(); ++i) {
    best.passes[i].span_us = std::min(best.passes[i].span_us, round.passes[i].span_us);
    best.passes[i].before_us = std::min(best.passes[i].before_us, round.passes[i].before_us);
  }
}

void print_passes(const char* what, const TracedCall& call) {
  std::printf("\n%s, passes in order (min over rounds, ms; 'before' = time since the previous pass):\n", what);
  std::printf("| pass | events | ms | before ms |\n|---|---:|---:|---:|\n");
  double in_passes = 0, between = 0;
  for (const Pass& p : call.passes) {
    std::printf("| %s | %d | %.2f | %.2f |\n", p.name.c_str(), p.events, p.span_us / 1e3, p.before_us / 1e3);
    in_passes += p.span_us;
    between += p.before_us;
  }
  std::printf("| **whole call** | | %.2f (passes %.2f, between %.2f) | |\n", call.total_us / 1e3, in_passes / 1e3,
              between / 1e3);
}

int run(int rounds, std::int64_t tokens) {
  set_compute_threads(1);
  ep::ExpertRows rows = layer_rows(tokens);
  const std::int64_t num_rows = rows.num_rows();
  const Tensor wi0 = random_tensor({kExperts, kHidden, kFfn}, 2, 0.03f);
  const Tensor wi1 = random_tensor({kExperts, kHidden, kFfn}, 3, 0.03f);
  const Tensor wo = random_tensor({kExperts, kFfn, kHidden}, 4, 0.04f);
  const Tensor slot_dy = random_tensor({rows.num_slots, kHidden}, 5, 1.0f);
  Tensor dwi0(DType::f32, {kExperts, kHidden, kFfn}), dwi1(DType::f32, {kExperts, kHidden, kFfn}),
      dwo(DType::f32, {kExperts, kFfn, kHidden});
  const ExpertShape shape{.hidden = kHidden, .ffn = kFfn};
  std::printf(
      "bench_expert_passes: %lld rows of %lld tokens, top %d of %d experts (%lld..%lld rows each), H=%lld "
      "F=%lld, f32, 1 thread, %d rounds; load average %s\n",
      static_cast<long long>(num_rows), static_cast<long long>(tokens), kTopK, kExperts,
      static_cast<long long>(*std::min_element(rows.group_sizes.begin(), rows.group_sizes.end())),
      static_cast<long long>(*std::max_element(rows.group_sizes.begin(), rows.group_sizes.end())),
      static_cast<long long>(kHidden), static_cast<long long>(kFfn), rounds, bench::load_average().c_str());

  // The products alone, on operands of the layer's shapes.
  const Tensor f_rows = random_tensor({num_rows, kFfn}, 6, 1.0f), h_rows = random_tensor({num_rows, kHidden}, 7, 1.0f);
  Tensor f_out(DType::f32, {num_rows, kFfn}), h_out(DType::f32, {num_rows, kHidden});
  Tensor dw_out(DType::f32, {kExperts, kHidden, kFfn});
  std::uint64_t version = 1;
  auto grouped = [&](std::int64_t k, std::int64_t n) {
    return GroupedGemmShape{.group_sizes = rows.group_sizes, .k = k, .n = n, .weight_version = version};
  };
  const double up_flops = 2.0 * double(num_rows) * kHidden * kFfn;
  struct Alone {
    const char* name;
    std::function<void()> call;
    int products = 1;  // of up_flops each
    double best_us = 1e300;
  };
  // Candidates: the two up-projection products of dx (or of dwi0, dwi1) as
  // one product of twice the inner (or output) size, on [d_h0 | d_h1] rows
  // and [wi0 | wi1] matrices.
  const Tensor wi01 = random_tensor({kExperts, kHidden, 2 * kFfn}, 8, 0.03f);
  const Tensor f2_rows = random_tensor({num_rows, 2 * kFfn}, 9, 1.0f);
  Tensor dw2_out(DType::f32, {kExperts, kHidden, 2 * kFfn});
  std::uint64_t concatenation_version = 1u << 30;
  auto matrices = [](const Tensor& w, std::int64_t elements) {
    std::vector<const float*> out;
    for (int e = 0; e < kExperts; ++e) out.push_back(w.data<float>() + e * elements);
    return out;
  };
  std::vector<Alone> alone = {
      {"forward x wi0 (up)",
       [&] {
         grouped_gemm_forward(grouped(kHidden, kFfn), rows.x.data<float>(), wi0.data<float>(), f_out.data<float>());
       }},
      {"forward act wo (down)",
       [&] {
         grouped_gemm_forward(grouped(kFfn, kHidden), f_rows.data<float>(), wo.data<float>(), h_out.data<float>());
       }},
      {"drhs dwo = act^T d_out",
       [&] {
         grouped_gemm_drhs(grouped(kFfn, kHidden), f_rows.data<float>(), h_rows.data<float>(), dw_out.data<float>());
       }},
      {"dlhs d_act = d_out wo^T",
       [&] { grouped_gemm_dlhs(grouped(kFfn, kHidden), h_rows.data<float>(), wo.data<float>(), f_out.data<float>()); }},
      {"drhs dwi0 = x^T d_h0",
       [&] {
         grouped_gemm_drhs(grouped(kHidden, kFfn), rows.x.data<float>(), f_rows.data<float>(), dw_out.data<float>());
       }},
      {"dlhs dx = d_h0 wi0^T",
       [&] {
         grouped_gemm_dlhs(grouped(kHidden, kFfn), f_rows.data<float>(), wi0.data<float>(), h_out.data<float>());
       }},
      {"dlhs dx += d_h1 wi1^T",
       [&] {
         grouped_gemm_dlhs(grouped(kHidden, kFfn), f_rows.data<float>(), wi1.data<float>(), h_out.data<float>(), true);
       }},
      {"dlhs dx = [d_h0|d_h1] [wi0|wi1]^T (K = 2F)",
       [&] {
         grouped_gemm_dlhs(grouped(kHidden, 2 * kFfn), f2_rows.data<float>(), wi01.data<float>(), h_out.data<float>());
       },
       2},
      {"drhs [dwi0|dwi1] = x^T [d_h0|d_h1] (N = 2F)",
       [&] {
         grouped_gemm_drhs(grouped(kHidden, 2 * kFfn), rows.x.data<float>(), f2_rows.data<float>(),
                           dw2_out.data<float>());
       },
       2},
      // What the K = 2F dlhs would add in training, where every step has new
      // weights: [wi0 | wi1] rebuilt at a new version (no product).
      {"build [wi0|wi1] at a new version (no product)",
       [&] {
         const std::vector<const float*> w0 = matrices(wi0, kHidden * kFfn), w1 = matrices(wi1, kHidden * kFfn);
         concatenated_weights(w0, w1, kHidden, kFfn, ++concatenation_version);
       },
       0},
  };

  const std::string path = "/tmp/bench_expert_passes." + std::to_string(::getpid()) + ".json";
  TracedCall forward, backward;
  double fma_gflops = 0;
  for (int r = 0; r < rounds; ++r) {
    version = static_cast<std::uint64_t>(r + 1);
    const LocalExpertWeights weights{
        .wi0 = wi0.data<float>(), .wi1 = wi1.data<float>(), .wo = wo.data<float>(), .version = version};
    ExpertActivations saved;
    keep_minimum(forward, traced([&] { experts_forward(shape, rows, weights, saved); }, path));
    keep_minimum(backward, traced(
                               [&] {
                                 experts_backward(shape, rows, weights, saved, slot_dy, dwi0.mutable_view(),
                                                  dwi1.mutable_view(), dwo.mutable_view(), /*accumulate=*/false);
                               },
                               path));
    for (Alone& a : alone) {
      a.call();
      const auto start = std::chrono::steady_clock::now();
      a.call();
      a.best_us = std::min(a.best_us,
                           std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    fma_gflops = std::max(fma_gflops, bench::measure_fma_peak(1, 0.05, 1).gflops);
  }
  std::remove(path.c_str());
  print_passes("experts_forward", forward);
  print_passes("experts_backward", backward);
  std::printf(
      "\nEach product alone (second of two calls, min over rounds; every product has %.2f GFLOP, a K = 2F or N = 2F "
      "one twice that), FMA peak "
      "%.1f GFLOP/s; load average %s:\n| product | ms | GFLOP/s | of FMA peak |\n|---|---:|---:|---:|\n",
      up_flops / 1e9, fma_gflops, bench::load_average().c_str());
  for (const Alone& a : alone) {
    const double gflops = a.products * up_flops / (a.best_us * 1e3);
    if (a.products == 0)
      std::printf("| %s | %.2f | | |\n", a.name, a.best_us / 1e3);
    else
      std::printf("| %s | %.2f | %.1f | %.2f |\n", a.name, a.best_us / 1e3, gflops, gflops / fma_gflops);
  }
  std::printf("At the FMA peak one product takes %.2f ms.\n", up_flops / (fma_gflops * 1e6));
  return 0;
}

}  // namespace
}  // namespace epmoe

int main(int argc, char** argv) {
  int rounds = 10;
  std::int64_t tokens = 2048;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) {
      tokens = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--rounds N] [--tokens N]\n", argv[0]);
      return 2;
    }
  }
  return epmoe::run(rounds, tokens);
}
