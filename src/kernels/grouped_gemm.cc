#include "kernels/grouped_gemm.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threading.h"
#include "kernels/gemm.h"

namespace epmoe {
namespace {

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

GroupLayout layout_groups(const GroupedGemmShape& shape) {
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

// Calls run_group(g) for every group: team groups one after another with the
// caller's whole thread budget, then solo groups spread over the threads. An
// exception in a worker is carried out of the parallel region and rethrown.
template <typename RunGroup>
void for_each_group(const GroupLayout& layout, const RunGroup& run_group) {
  for (int g : layout.team_groups) run_group(g);
  const auto num_solo = static_cast<std::int64_t>(layout.solo_groups.size());
  if (num_solo == 0) return;
  const int num_threads = static_cast<int>(std::min<std::int64_t>(compute_threads(), num_solo));
  std::exception_ptr error;
#pragma omp parallel num_threads(num_threads)
  {
    // Each worker's budget becomes 1 for this region only (nthreads-var is a
    // per-task ICV), so that oneDNN plans its primitives for 1 thread and
    // parallel_for (e.g. the bf16 conversion) does not split work for a
    // nested team that OpenMP will not create.
    set_compute_threads(1);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < num_solo; ++i) {
      try {
        run_group(layout.solo_groups[i]);
      } catch (...) {
#pragma omp critical(epmoe_grouped_gemm_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

// Checks the per-group pointers: one non-null matrix per group.
template <typename Pointer>
void check_group_pointers(const GroupedGemmShape& shape, std::span<Pointer const> groups,
                          const char* what) {
  if (groups.size() != shape.group_sizes.size())
    throw InternalError(std::string("grouped GEMM: ") + std::to_string(groups.size()) + " " + what +
                        " pointers for " + std::to_string(shape.group_sizes.size()) + " groups");
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (groups[g] == nullptr)
      throw InternalError(std::string("grouped GEMM: ") + what + " pointer of group " +
                          std::to_string(g) + " is null");
}

// Group g's matrix at g * k * n of a contiguous [G, k, n] array. Not checked
// like the caller's pointers: a null base with only empty groups (nothing
// read) stays accepted as before the per-group form.
template <typename T>
std::vector<T*> contiguous_groups(const GroupedGemmShape& shape, T* base) {
  std::vector<T*> groups(shape.group_sizes.size());
  for (std::size_t g = 0; g < groups.size(); ++g)
    groups[g] = base == nullptr ? nullptr : base + static_cast<std::int64_t>(g) * shape.k * shape.n;
  return groups;
}

void forward_groups(const GroupedGemmShape& shape, const float* x,
                    std::span<const float* const> w_groups, float* out) {
  const GroupLayout layout = layout_groups(shape);
  for_each_group(layout, [&](int g) {
    const std::int64_t row = layout.offsets[g];
    gemm({.a = x + row * shape.k,
          .b = w_groups[g],
          .c = out + row * shape.n,
          .m = shape.group_sizes[g],
          .n = shape.n,
          .k = shape.k,
          .compute_dtype = shape.compute_dtype,
          .dynamic_dim = GemmDynamicDim::m,
          .b_version = shape.weight_version,
          .pack_b = shape.pack_weights,
          .trace_name = "expert group forward"});
  });
}

void dlhs_groups(const GroupedGemmShape& shape, const float* dout,
                 std::span<const float* const> w_groups, float* dx, bool accumulate) {
  const GroupLayout layout = layout_groups(shape);
  for_each_group(layout, [&](int g) {
    const std::int64_t row = layout.offsets[g];
    gemm({.a = dout + row * shape.n,
          .b = w_groups[g],  // W_g stored [k, n], used as W_g^T
          .c = dx + row * shape.k,
          .m = shape.group_sizes[g],
          .n = shape.k,
          .k = shape.n,
          .transpose_b = true,
          .accumulate = accumulate,
          .compute_dtype = shape.compute_dtype,
          .dynamic_dim = GemmDynamicDim::m,
          .b_version = shape.weight_version,
          .pack_b = shape.pack_weights,
          .trace_name = "expert group dgrad"});
  });
}

void drhs_groups(const GroupedGemmShape& shape, const float* x, const float* dout,
                 std::span<float* const> dw_groups) {
  const GroupLayout layout = layout_groups(shape);
  // An empty group has inner size 0, which gemm answers with a zero-filled dW_g.
  for_each_group(layout, [&](int g) {
    const std::int64_t row = layout.offsets[g];
    gemm({.a = x + row * shape.k,  // x_g stored [rows, k], used as x_g^T
          .b = dout + row * shape.n,
          .c = dw_groups[g],
          .m = shape.k,
          .n = shape.n,
          .k = shape.group_sizes[g],
          .transpose_a = true,
          .compute_dtype = shape.compute_dtype,
          .dynamic_dim = GemmDynamicDim::k,
          .trace_name = "expert group wgrad"});
  });
}

}  // namespace

void grouped_gemm_forward(const GroupedGemmShape& shape, const float* x,
                          std::span<const float* const> w_groups, float* out) {
  check_group_pointers(shape, w_groups, "weight");
  forward_groups(shape, x, w_groups, out);
}

void grouped_gemm_dlhs(const GroupedGemmShape& shape, const float* dout,
                       std::span<const float* const> w_groups, float* dx, bool accumulate) {
  check_group_pointers(shape, w_groups, "weight");
  dlhs_groups(shape, dout, w_groups, dx, accumulate);
}

void grouped_gemm_drhs(const GroupedGemmShape& shape, const float* x, const float* dout,
                       std::span<float* const> dw_groups) {
  check_group_pointers(shape, dw_groups, "weight gradient");
  drhs_groups(shape, x, dout, dw_groups);
}

void grouped_gemm_forward(const GroupedGemmShape& shape, const float* x, const float* w,
                          float* out) {
  forward_groups(shape, x, contiguous_groups(shape, w), out);
}

void grouped_gemm_dlhs(const GroupedGemmShape& shape, const float* dout, const float* w,
                       float* dx, bool accumulate) {
  dlhs_groups(shape, dout, contiguous_groups(shape, w), dx, accumulate);
}

void grouped_gemm_drhs(const GroupedGemmShape& shape, const float* x, const float* dout,
                       float* dw) {
  drhs_groups(shape, x, dout, contiguous_groups(shape, dw));
}

}  // namespace epmoe
