// The whole-world layer call (<epmoe/whole_world_layer.h>,
// WholeWorldLayer::run) on the arrays of an `epmoe gen-inputs` directory,
// `repeats` calls after a warm-up, forward only (or forward + backward when
// the directory has dy.npy): per call, its wall time and, from its own
// metrics, the layer's time inside the ranks (the slowest rank's forward
// [+ backward], as the ranks measured it). Their difference is what the
// call costs beyond the layer's own work: waking the kept rank threads,
// checking and viewing the arrays, summing dgate, building the metrics.
//   bench_api_layer_call DIR REPEATS [key=value ...]
// Prints medians in microseconds: "call <us> layer <us> overhead <us>".
// bench/peers/python_layer_overhead.py holds the Python call against the
// first figure. The metrics (metrics_json(), made on demand) are not part of
// the call.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <epmoe/whole_world_layer.h>

#include "data/npy.h"

namespace {

double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 3) return std::fprintf(stderr, "usage: bench_api_layer_call DIR REPEATS [key=value ...]\n"), 2;
  const std::string dir = argv[1];
  const int repeats = std::stoi(argv[2]);
  std::map<std::string, std::string> keys;
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    keys[arg.substr(0, arg.find('='))] = arg.substr(arg.find('=') + 1);
  }
  using epmoe::DType;
  const epmoe::Tensor x = epmoe::read_npy(dir + "/x.npy", DType::f32),
                      gate = epmoe::read_npy(dir + "/gate.npy", DType::f32),
                      wi0 = epmoe::read_npy(dir + "/wi0.npy", DType::f32),
                      wi1 = epmoe::read_npy(dir + "/wi1.npy", DType::f32),
                      wo = epmoe::read_npy(dir + "/wo.npy", DType::f32);
  const bool backward = std::filesystem::exists(dir + "/dy.npy");
  std::optional<epmoe::Tensor> dy;
  if (backward) dy = epmoe::read_npy(dir + "/dy.npy", DType::f32);
  epmoe::WholeWorldLayer layer(keys);
  const std::int64_t n = x.dim(0), h = x.dim(1), e = gate.dim(1), f = wi0.dim(2), k = layer.top_k();
  std::vector<float> y(n * h), weights(n * k), dx(n * h), dgate(h * e), dwi0(e * h * f), dwi1(e * h * f),
      dwo(e * f * h);
  std::vector<std::int32_t> ids(n * k);
  epmoe::LayerArrays in{.x = x, .gate = gate, .wi0 = wi0, .wi1 = wi1, .wo = wo};
  epmoe::LayerOutputs out{.y = epmoe::MutableTensorView(y.data(), {n, h}),
                          .topk_ids = epmoe::MutableTensorView(ids.data(), {n, k}),
                          .topk_weights = epmoe::MutableTensorView(weights.data(), {n, k})};
  if (backward) {
    in.dy = *dy;
    out.dx = epmoe::MutableTensorView(dx.data(), {n, h});
    out.dgate = epmoe::MutableTensorView(dgate.data(), {h, e});
    out.dwi0 = epmoe::MutableTensorView(dwi0.data(), {e, h, f});
    out.dwi1 = epmoe::MutableTensorView(dwi1.data(), {e, h, f});
    out.dwo = epmoe::MutableTensorView(dwo.data(), {e, f, h});
  }
  layer.run(in, out);  // warm-up: the rank threads, their groups and layers, caches, first-touch pages
  std::vector<double> call_us, layer_us, overhead_us;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    layer.run(in, out);
    const double call = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e6;
    const double own = nlohmann::json::parse(layer.metrics_json()).at("total_seconds").get<double>() * 1e6;
    call_us.push_back(call);
    layer_us.push_back(own);
    overhead_us.push_back(call - own);
  }
  std::printf("call %.1f layer %.1f overhead %.1f\n", median(call_us), median(layer_us), median(overhead_us));
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "bench_api_layer_call: %s\n", error.what());
  return 2;
}
