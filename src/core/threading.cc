#include "core/threading.h"

#include <omp.h>

#include <algorithm>
#include <thread>

#include "core/error.h"

namespace epmoe {

int hardware_cores() { return std::max(1u, std::thread::hardware_concurrency()); }

void set_compute_threads(int num_threads) {
  EPMOE_CHECK_GE(num_threads, 1);
  omp_set_num_threads(num_threads);
}

int compute_threads() { return omp_get_max_threads(); }

void parallel_for(std::int64_t n, std::int64_t min_grain, const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (n <= 0) return;
  const std::int64_t grain = std::max<std::int64_t>(1, min_grain);
  const std::int64_t max_slices = (n + grain - 1) / grain;
  const int num_threads = static_cast<int>(std::min<std::int64_t>(compute_threads(), max_slices));
  if (num_threads <= 1) {
    body(0, n);
    return;
  }
#pragma omp parallel num_threads(num_threads)
  {
    // The team may be smaller than asked for (inside another parallel
    // region it is one thread), so slice by the team actually running.
    const std::int64_t team = omp_get_num_threads();
    const std::int64_t t = omp_get_thread_num();
    const std::int64_t begin = n * t / team;
    const std::int64_t end = n * (t + 1) / team;
    if (begin < end) body(begin, end);
  }
}

}  // namespace epmoe
