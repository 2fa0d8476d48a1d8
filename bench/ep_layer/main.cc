#include <cstdio>
#include <exception>

#include "ep_layer_bench.h"

int main(int argc, char** argv) {
  try {
    return epmoe::bench::run_ep_layer_bench(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ep_layer: error: %s\n", e.what());
    return 2;
  }
}
