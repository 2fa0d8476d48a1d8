// One expert-parallel MoE layer, forward and backward, on this program's own
// buffers: 2 rank threads, 8 experts, top-2. Writes its inputs and outputs as
// .npy to the directory given, so that `epmoe layer --in DIR/inputs` can be
// compared with it file for file.
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include <epmoe/error.h>
#include <epmoe/npy.h>
#include <epmoe/whole_world_layer.h>

int main(int argc, char** argv) try {
  if (argc != 2) return std::fprintf(stderr, "usage: embed_layer OUT_DIR\n"), 2;
  const std::filesystem::path out = argv[1];
  const std::int64_t n = 64, h = 32, f = 48, e = 8, k = 2;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  auto random = [&](std::int64_t size) {
    std::vector<float> v(size);
    for (float& value : v) value = normal(rng);
    return v;
  };
  std::vector<float> x = random(n * h), gate = random(h * e), wi0 = random(e * h * f), wi1 = random(e * h * f),
                     wo = random(e * f * h), dy = random(n * h);
  std::vector<float> y(n * h), topk_weights(n * k), dx(n * h), dgate(h * e), dwi0(e * h * f), dwi1(e * h * f),
      dwo(e * f * h);
  std::vector<std::int32_t> topk_ids(n * k);

  using epmoe::TensorView, epmoe::MutableTensorView;
  const epmoe::LayerArrays in{.x = TensorView(x.data(), {n, h}),
                              .gate = TensorView(gate.data(), {h, e}),
                              .wi0 = TensorView(wi0.data(), {e, h, f}),
                              .wi1 = TensorView(wi1.data(), {e, h, f}),
                              .wo = TensorView(wo.data(), {e, f, h}),
                              .dy = TensorView(dy.data(), {n, h})};
  const epmoe::LayerOutputs result{.y = MutableTensorView(y.data(), {n, h}),
                                   .topk_ids = MutableTensorView(topk_ids.data(), {n, k}),
                                   .topk_weights = MutableTensorView(topk_weights.data(), {n, k}),
                                   .dx = MutableTensorView(dx.data(), {n, h}),
                                   .dgate = MutableTensorView(dgate.data(), {h, e}),
                                   .dwi0 = MutableTensorView(dwi0.data(), {e, h, f}),
                                   .dwi1 = MutableTensorView(dwi1.data(), {e, h, f}),
                                   .dwo = MutableTensorView(dwo.data(), {e, f, h})};

  epmoe::WholeWorldLayer layer({{"ranks", "2"}, {"top_k", std::to_string(k)}, {"dispatch", "alltoall"}});
  layer.run(in, result);

  std::filesystem::create_directories(out / "inputs");
  for (const auto& [name, view] :
       {std::pair{"x", in.x}, {"gate", in.gate}, {"wi0", in.wi0}, {"wi1", in.wi1}, {"wo", in.wo}, {"dy", in.dy}})
    epmoe::write_npy((out / "inputs" / (std::string(name) + ".npy")).string(), view);
  for (const auto& [name, view] : {std::pair{"y", TensorView(result.y)},
                                   {"topk_ids", TensorView(result.topk_ids)},
                                   {"topk_weights", TensorView(result.topk_weights)},
                                   {"dx", TensorView(result.dx)},
                                   {"dgate", TensorView(result.dgate)},
                                   {"dwi0", TensorView(result.dwi0)},
                                   {"dwi1", TensorView(result.dwi1)},
                                   {"dwo", TensorView(result.dwo)}})
    epmoe::write_npy((out / (std::string(name) + ".npy")).string(), view);
  std::printf("embed_layer: y[0] = %.6f, dwo[0] = %.6f; inputs and outputs in %s\n", y[0], dwo[0], argv[1]);
  return 0;
} catch (const epmoe::Error& error) {
  std::fprintf(stderr, "embed_layer: %s\n", error.what());
  return 2;
}
