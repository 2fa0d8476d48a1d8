#include "collectives_bench.h"

int main(int argc, char** argv) { return epmoe::bench::run_collectives_bench(argc, argv); }
