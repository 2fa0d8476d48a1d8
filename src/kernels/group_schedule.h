// How a grouped product's groups share the caller's threads
// (GroupSchedule, kernels/grouped_gemm.h): which groups run one after
// another on all threads and which side by side on one thread each. Shared
// by grouped_gemm.cc and swiglu_up_projection.cc, because oneDNN's bits
// depend on the thread count a product runs on: a fused product must give
// each group the schedule the unfused one gives it to keep its bits.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <vector>

#include "core/error.h"
#include "core/threading.h"
#include "kernels/grouped_gemm.h"

namespace epmoe::detail {

// Scheduling, measured on this machine's 2 cores (in-process A/B, min of 7,
// M = E * rows, H = 1024, F = 512, equal groups; GFLOP/s with every group on
// both threads in turn -> one group per thread):
//   rows/group  16: f32 fwd  82 -> 89,  drhs  75 -> 86;  bf16 fwd  35 -> 119
//   rows/group 128: f32 fwd 178 -> 190, drhs 136 -> 174; bf16 fwd 189 -> 294
//   rows/group 512: f32 fwd 197 -> 198, drhs 156 -> 179; bf16 fwd 293 -> 345
// One thread per group never lost (1.01x-3.4x over all 30 cases): oneDNN
// splitting one product over two cores pays synchronisation and thinner
// tiles, and its bf16 operand conversion runs serially between products.
// What one thread per group cannot do is balance a group that alone holds
// more than a thread's share of the rows (a Zipf-hot expert), so exactly
// those groups get all threads.
struct GroupLayout {
  std::vector<std::int64_t> offsets;  // G + 1 row offsets
  std::vector<int> team_groups;       // run one after another, each on all threads
  std::vector<int> solo_groups;       // run side by side, one thread each, largest first
};

inline GroupLayout layout_groups(const GroupedGemmShape& shape) {
  const auto num_groups = static_cast<int>(shape.group_sizes.size());
  GroupLayout layout;
  layout.offsets.resize(num_groups + 1, 0);
  for (int g = 0; g < num_groups; ++g) {
    EPMOE_CHECK_GE(shape.group_sizes[g], 0);
    layout.offsets[g + 1] = layout.offsets[g] + shape.group_sizes[g];
  }
  const int num_threads = compute_threads();
  const std::int64_t fair_share_rows = layout.offsets.back() / num_threads;
  for (int g = 0; g < num_groups; ++g) {
    const bool team = num_threads == 1 || shape.schedule == GroupSchedule::one_group_at_a_time ||
                      shape.group_sizes[g] > fair_share_rows;
    (team ? layout.team_groups : layout.solo_groups).push_back(g);
  }
  // Longest-processing-time first: with dynamic scheduling this bounds the
  // idle tail by the smallest groups.
  std::stable_sort(layout.solo_groups.begin(), layout.solo_groups.end(),
                   [&](int x, int y) { return shape.group_sizes[x] > shape.group_sizes[y]; });
  return layout;
}

// Calls run_task(i) for i in [0, num_tasks), spread over the caller's
// threads, one thread each, taken in index order as threads free up (so
// tasks listed largest first bound the idle tail by the smallest). An
// exception in a worker is carried out of the parallel region and rethrown.
template <typename RunTask>
void for_each_task(std::int64_t num_tasks, const RunTask& run_task) {
  if (num_tasks == 0) return;
  const int num_threads = static_cast<int>(std::min<std::int64_t>(compute_threads(), num_tasks));
  std::exception_ptr error;
#pragma omp parallel num_threads(num_threads)
  {
    // Each worker's budget becomes 1 for this region only (nthreads-var is a
    // per-task ICV), so that oneDNN plans its primitives for 1 thread and
    // parallel_for (e.g. the bf16 conversion) does not split work for a
    // nested team that OpenMP will not create.
    set_compute_threads(1);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < num_tasks; ++i) {
      try {
        run_task(i);
      } catch (...) {
#pragma omp critical(epmoe_grouped_gemm_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

// Calls run_group(g) for every group: team groups one after another with the
// caller's whole thread budget, then solo groups spread over the threads.
template <typename RunGroup>
void for_each_group(const GroupLayout& layout, const RunGroup& run_group) {
  for (int g : layout.team_groups) run_group(g);
  for_each_task(static_cast<std::int64_t>(layout.solo_groups.size()),
                [&](std::int64_t i) { run_group(layout.solo_groups[i]); });
}

}  // namespace epmoe::detail
