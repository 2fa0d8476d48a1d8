// The public C++ layer call (<epmoe/whole_world_layer.h>, WholeWorldLayer::run) on
// the arrays of an `epmoe gen-inputs` directory: the median wall time of
// `repeats` forward calls, for bench/peers/python_layer_overhead.py to hold
// the Python call (epmoe.MoeLayer.forward) against.
//   bench_api_layer_call DIR REPEATS [key=value ...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <epmoe/whole_world_layer.h>

#include "data/npy.h"

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
  epmoe::WholeWorldLayer layer(keys);
  const std::int64_t n = x.dim(0), h = x.dim(1), k = layer.top_k();
  std::vector<float> y(n * h), weights(n * k);
  std::vector<std::int32_t> ids(n * k);
  const epmoe::LayerArrays in{.x = x, .gate = gate, .wi0 = wi0, .wi1 = wi1, .wo = wo};
  const epmoe::LayerOutputs out{.y = epmoe::MutableTensorView(y.data(), {n, h}),
                                .topk_ids = epmoe::MutableTensorView(ids.data(), {n, k}),
                                .topk_weights = epmoe::MutableTensorView(weights.data(), {n, k})};
  layer.run(in, out);  // warm-up: caches, first-touch pages
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    layer.run(in, out);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + repeats / 2, seconds.end());
  std::printf("%.3f\n", seconds[repeats / 2] * 1e6);  // median microseconds per call
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "bench_api_layer_call: %s\n", error.what());
  return 2;
}
