// Compute threading: one documented choice, OpenMP.
//
// Debian's oneDNN is built with the OpenMP runtime, so its matmuls run on the
// calling thread's OpenMP team. Our own loops use the same runtime (through
// parallel_for below) so that the two never oversubscribe each other.
// omp_set_num_threads is per calling thread, which is what ranks-as-threads
// need: each rank thread sets its own share of the cores
// (set_compute_threads(cores / ranks), at least 1) and every parallel region
// it opens - ours or oneDNN's - uses that many threads.
#pragma once

#include <cstdint>
#include <functional>

namespace epmoe {

int hardware_cores();                       // std::thread::hardware_concurrency, at least 1
void set_compute_threads(int num_threads);  // for the calling thread; >= 1
int compute_threads();                      // the calling thread's budget

// Calls body(begin, end) on contiguous, disjoint slices covering [0, n), in
// parallel on the calling thread's budget. Slices are at least min_grain long.
void parallel_for(std::int64_t n, std::int64_t min_grain, const std::function<void(std::int64_t, std::int64_t)>& body);

// The min_grain of elementwise, memory-bound loops (SwiGLU, AdamW, norms,
// embeddings, cross entropy): a second thread pays off above ~32K elements,
// the OpenMP wake-up costing a few microseconds.
constexpr std::int64_t kElementwiseGrain = 1 << 15;

}  // namespace epmoe
