// Single-rank MoE layer, forward + backward (the default layer and, in the
// same run, the opt-in concatenated wi0|wi1 product: their time ratio), against one large
// matmul of the same total FLOPs, against issue 29's bound (one expert's
// forward product at the mean rows per expert, M = N K / E, K = H, N = F,
// on a fixed-shape primitive with the weights pre-packed into oneDNN's
// chosen layout, on the same threads: what the library gives one expert
// when nothing is ragged) and against the f32 FMA peak (a tight FMA loop on
// the same threads, bench/fma_peak.h), all measured in the same run. Prints a table, or one
// JSON object per line with json=true (bench/peers/compare_layer_with_torch.sh
// reads that). compute_dtype=bf16 where this CPU has no oneDNN bf16 matmul
// is reported as skipped (both) or refused (bf16 alone).
//
//   bench_moe_layer [tokens=2048 hidden=1024 ffn=512 experts=16 top_k=2
//                    compute_dtype=f32|bf16|both threads=N seconds=0.3 json=false
//                    phases=false fixed_weights=false]
// fixed_weights=true gives every forward the same weight version (frozen
// weights, as in inference: the kernels' per-version forms are made once);
// by default each forward has a new one, as in training, where the
// weights change every step (kernels/gemm.h, GemmArgs::b_version).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <epmoe/moe_layer.h>
#include "bench_harness.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "core/threading.h"
#include "fma_peak.h"
#include "kernels/gemm.h"

namespace epmoe::bench {
namespace {

struct LayerBenchArgs {
  std::int64_t tokens = 2048, hidden = 1024, ffn = 512;
  int experts = 16, top_k = 2, threads = 0;
  std::string compute_dtype = "both";
  double seconds = 0.3;
  bool json = false;
  bool phases = false;  // also print one step's time per layer phase
  bool fixed_weights = false;
};

LayerBenchArgs parse_args(int argc, char** argv) {
  LayerBenchArgs args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "bench_moe_layer: expected key=value, got '%s'\n", arg.c_str());
      std::exit(2);
    }
    const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
    if (key == "tokens")
      args.tokens = std::stoll(value);
    else if (key == "hidden")
      args.hidden = std::stoll(value);
    else if (key == "ffn")
      args.ffn = std::stoll(value);
    else if (key == "experts")
      args.experts = std::stoi(value);
    else if (key == "top_k")
      args.top_k = std::stoi(value);
    else if (key == "threads")
      args.threads = std::stoi(value);
    else if (key == "compute_dtype")
      args.compute_dtype = value;
    else if (key == "seconds")
      args.seconds = std::stod(value);
    else if (key == "json")
      args.json = value == "true" || value == "1";
    else if (key == "phases")
      args.phases = value == "true" || value == "1";
    else if (key == "fixed_weights")
      args.fixed_weights = value == "true" || value == "1";
    else {
      std::fprintf(stderr, "bench_moe_layer: unknown key '%s'\n", key.c_str());
      std::exit(2);
    }
  }
  return args;
}

Tensor random_tensor(Shape shape, Rng& rng, double scale) {
  Tensor t(DType::f32, std::move(shape));
  for (float& v : t.span<float>()) v = static_cast<float>(rng.normal() * scale);
  return t;
}

void run(const LayerBenchArgs& args, ComputeDType dtype, const FmaPeak& peak) {
  Rng rng(1);
  const std::int64_t n = args.tokens, h = args.hidden, f = args.ffn, e = args.experts;
  Tensor x = random_tensor({n, h}, rng, 1.0), dy = random_tensor({n, h}, rng, 1.0);
  Tensor gate = random_tensor({h, e}, rng, 1.0 / std::sqrt(double(h)));
  Tensor wi0 = random_tensor({e, h, f}, rng, 1.0 / std::sqrt(double(h)));
  Tensor wi1 = random_tensor({e, h, f}, rng, 1.0 / std::sqrt(double(h)));
  Tensor wo = random_tensor({e, f, h}, rng, 1.0 / std::sqrt(double(f)));
  // The default layer (its up projection: two products per task with the
  // SwiGLU as the task's epilogue) and the one with the opt-in concatenated
  // wi0|wi1 product (MoeLayerConfig::fuse_up_projection), timed in the same run.
  EpGroup group(EpConfig{.num_experts = args.experts, .top_k = args.top_k, .hidden = h});  // one rank, both layers
  MoeLayer layer(
      {.hidden = h, .ffn = f, .router = {.num_experts = args.experts, .top_k = args.top_k}, .compute_dtype = dtype},
      group);
  MoeLayer concatenated_layer({.hidden = h,
                               .ffn = f,
                               .router = {.num_experts = args.experts, .top_k = args.top_k},
                               .compute_dtype = dtype,
                               .fuse_up_projection = true},
                              group);
  const std::optional<std::uint64_t> version = args.fixed_weights ? std::optional<std::uint64_t>(1) : std::nullopt;
  const MoeWeights weights{gate, wi0, wi1, wo, {}};

  const BenchOptions options{.warmup_calls = 1, .min_repetition_seconds = args.seconds, .repetitions = 5};
  // Expert GEMMs: 3 forward products of 2*M*H*F FLOPs, 6 backward (dlhs and
  // drhs of each); router: 2*N*H*E forward, 4*N*H*E backward.
  const double rows = double(n) * args.top_k;
  const double flops = 18.0 * rows * h * f + 6.0 * n * h * e;

  // One large matmul of the same FLOPs: [rows, h] x [h, cols].
  const std::int64_t cols = std::max<std::int64_t>(1, std::llround(flops / (2.0 * rows * h)));
  Tensor a = random_tensor({std::int64_t(rows), h}, rng, 1.0), b = random_tensor({h, cols}, rng, 1.0);
  Tensor c(DType::f32, {std::int64_t(rows), cols});
  // The bound: one expert's forward product at the mean rows per expert,
  // exact shape, weights packed once (GemmArgs::pack_b with a version).
  const std::int64_t expert_rows = std::max<std::int64_t>(1, std::llround(rows / double(e)));
  Tensor expert_x = random_tensor({expert_rows, h}, rng, 1.0), expert_out(DType::f32, {expert_rows, f});
  const GemmArgs bound_args{.a = expert_x.data<float>(),
                            .b = wi0.data<float>(),
                            .c = expert_out.data<float>(),
                            .m = expert_rows,
                            .n = f,
                            .k = h,
                            .compute_dtype = dtype,
                            .b_version = 1,
                            .pack_b = true};
  const double bound_flops = 2.0 * double(expert_rows) * h * f;
  // Interleaved repetitions (layer, matmul, layer, ...): a background load
  // that comes and goes hits both alike, so their ratio stays meaningful.
  const std::vector<BenchStats> measured =
      measure_interleaved({[&] {
                             layer.forward(x, weights, {.weight_version = version});
                             layer.backward(dy);
                           },
                           [&] {
                             concatenated_layer.forward(x, weights, {.weight_version = version});
                             concatenated_layer.backward(dy);
                           },
                           [&] {
                             gemm({.a = a.data<float>(),
                                   .b = b.data<float>(),
                                   .c = c.data<float>(),
                                   .m = std::int64_t(rows),
                                   .n = cols,
                                   .k = h,
                                   .compute_dtype = dtype});
                           },
                           [&] { gemm(bound_args); }},
                          options);
  const BenchStats& forward = measured[0];
  const BenchStats& concatenated = measured[1];
  const BenchStats& big = measured[2];
  const double bound_gflops = bound_flops / measured[3].median_seconds * 1e-9;
  // The fastest repetitions' ratio as well: on a machine shared with other
  // work the medians of the layer (one call a repetition) and of the bound
  // (thousands) are hit unevenly; the minima are each one's quietest moment.
  const double best_layer_gflops = flops / forward.min_seconds * 1e-9;
  const double best_bound_gflops = bound_flops / measured[3].min_seconds * 1e-9;
  const double big_flops = 2.0 * rows * h * cols;

  if (args.phases && !args.json) {
    // One more step, its time per phase (the layer's accumulated phase times, differenced).
    const std::map<std::string, double> before = layer.stats().phase_seconds;
    layer.forward(x, weights, {.weight_version = version});
    layer.backward(dy);
    std::string line;
    for (const auto& [phase, total] : layer.stats().phase_seconds) {
      const auto it = before.find(phase);
      const double step = total - (it == before.end() ? 0.0 : it->second);
      char item[96];
      std::snprintf(item, sizeof(item), " %s %.1f", phase.c_str(), step * 1e3);
      line += item;
    }
    std::printf("%-6s  phases (ms, one step):%s\n", to_string(dtype).c_str(), line.c_str());
  }
  // Which oneDNN implementation ran one step's products (issue 29: do the
  // expert products reach its brgemm / AMX kernels, or stay on gemm:jit?):
  // one more step with the census reset before it.
  reset_gemm_implementation_census();
  layer.forward(x, weights, {.weight_version = version});
  layer.backward(dy);
  std::string census_text, census_json;
  for (const GemmImplementationUse& use : gemm_implementation_census()) {
    const double share = use.flops / flops;
    char item[160];
    std::snprintf(item, sizeof(item), "%s%s (%s) %.1f%% in %lld calls", census_text.empty() ? "" : ", ",
                  use.implementation.c_str(), to_string(use.compute_dtype).c_str(), 100 * share, (long long)use.calls);
    census_text += item;
    std::snprintf(item, sizeof(item),
                  "%s{\"implementation\": \"%s\", \"compute_dtype\": \"%s\", \"calls\": %lld, "
                  "\"flop_share\": %.4f}",
                  census_json.empty() ? "" : ", ", use.implementation.c_str(), to_string(use.compute_dtype).c_str(),
                  (long long)use.calls, share);
    census_json += item;
  }
  const double layer_gflops = flops / forward.median_seconds * 1e-9;
  const double big_gflops = big_flops / big.median_seconds * 1e-9;
  const std::string name = to_string(dtype);
  if (args.json) {
    std::printf(
        "{\"impl\": \"epmoe\", \"compute_dtype\": \"%s\", \"tokens\": %lld, \"hidden\": %lld, "
        "\"ffn\": %lld, \"experts\": %d, \"top_k\": %d, \"threads\": %d, "
        "\"fwd_bwd_seconds\": %.6g, \"spread\": %.3f, \"gflops\": %.2f, "
        "\"concatenated_fwd_bwd_seconds\": %.6g, \"concatenated_spread\": %.3f, "
        "\"large_matmul_gflops\": %.2f, \"bound_gflops\": %.2f, \"bound_rows\": %lld, "
        "\"best_gflops\": %.2f, \"best_bound_gflops\": %.2f, \"fma_peak_gflops\": %.2f, "
        "\"implementations\": [%s]}\n",
        name.c_str(), (long long)n, (long long)h, (long long)f, args.experts, args.top_k, compute_threads(),
        forward.median_seconds, forward.relative_spread(), layer_gflops, concatenated.median_seconds,
        concatenated.relative_spread(), big_gflops, bound_gflops, (long long)expert_rows, best_layer_gflops,
        best_bound_gflops, peak.gflops, census_json.c_str());
  } else {
    std::printf(
        "%-6s  fwd+bwd %8.2f ms (spread %4.1f%%)  %7.1f GFLOP/s   large matmul %7.1f GFLOP/s   "
        "layer/matmul %.2f   layer/FMA peak %.2f   matmul/FMA peak %.2f\n",
        name.c_str(), forward.median_seconds * 1e3, 100 * forward.relative_spread(), layer_gflops, big_gflops,
        layer_gflops / big_gflops, layer_gflops / peak.gflops, big_gflops / peak.gflops);
    std::printf(
        "%-6s  bound (one expert's product, M=%lld, fixed shape, packed) %7.1f GFLOP/s   layer/bound %.2f   "
        "bound/FMA peak %.2f\n",
        name.c_str(), (long long)expert_rows, bound_gflops, layer_gflops / bound_gflops, bound_gflops / peak.gflops);
    std::printf(
        "%-6s  fastest repetitions: layer %7.1f GFLOP/s, bound %7.1f GFLOP/s, layer/bound %.2f, "
        "layer/FMA peak %.2f\n",
        name.c_str(), best_layer_gflops, best_bound_gflops, best_layer_gflops / best_bound_gflops,
        best_layer_gflops / peak.gflops);
    std::printf("%-6s  one step's FLOPs by oneDNN implementation: %s\n", name.c_str(), census_text.c_str());
    const double concatenated_gflops = flops / concatenated.median_seconds * 1e-9;
    std::printf(
        "%-6s  opt-in concatenated wi0|wi1: fwd+bwd %8.2f ms (spread %4.1f%%)  %7.1f GFLOP/s   "
        "concatenated/default time %.3f   concatenated/FMA peak %.2f\n",
        name.c_str(), concatenated.median_seconds * 1e3, 100 * concatenated.relative_spread(), concatenated_gflops,
        concatenated.median_seconds / forward.median_seconds, concatenated_gflops / peak.gflops);
  }
}

}  // namespace
}  // namespace epmoe::bench

int main(int argc, char** argv) {
  using namespace epmoe;
  const bench::LayerBenchArgs args = bench::parse_args(argc, argv);
  set_compute_threads(args.threads > 0 ? args.threads : hardware_cores());
  if (args.compute_dtype != "f32" && args.compute_dtype != "bf16" && args.compute_dtype != "both") {
    std::fprintf(stderr, "bench_moe_layer: compute_dtype must be f32, bf16 or both, not '%s'\n",
                 args.compute_dtype.c_str());
    return 2;
  }
  if (args.compute_dtype == "bf16" && !bf16_gemm_supported()) {
    std::fprintf(stderr, "bench_moe_layer: compute_dtype=bf16: oneDNN has no bf16 matmul on this CPU\n");
    return 2;
  }
  // The FMA ceiling on the same threads, just before the layer runs: the
  // best of 10 short repetitions, since a background load only lowers it
  // (a ratio against a peak measured in a busy moment overstates the layer).
  const bench::FmaPeak peak = bench::measure_fma_peak(compute_threads(), 0.1, 10);
  if (!args.json) {
    std::printf(
        "MoE layer forward+backward, N=%lld H=%lld F=%lld E=%d K=%d, %d threads, "
        "f32 FMA peak %.1f GFLOP/s (%d-lane FMA loop)\n",
        (long long)args.tokens, (long long)args.hidden, (long long)args.ffn, args.experts, args.top_k,
        compute_threads(), peak.gflops, peak.vector_floats);
  }
  if (args.compute_dtype == "f32" || args.compute_dtype == "both") bench::run(args, ComputeDType::f32, peak);
  if (args.compute_dtype == "bf16" || args.compute_dtype == "both") {
    if (bf16_gemm_supported())
      bench::run(args, ComputeDType::bf16, peak);
    else if (!args.json)
      std::printf("bf16    skipped: oneDNN has no bf16 matmul on this CPU\n");
  }
  return 0;
}
