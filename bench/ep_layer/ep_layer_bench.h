#pragma once

namespace epmoe::bench {

// `epmoe-bench layer` / bench_ep_layer: the expert-parallel layer, forward +
// backward, per dispatcher on emulated links (ranks as threads).
int run_ep_layer_bench(int argc, char** argv);

}  // namespace epmoe::bench
