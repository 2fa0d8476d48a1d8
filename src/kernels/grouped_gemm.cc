#include "kernels/grouped_gemm.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/group_schedule.h"

namespace epmoe {
namespace {

using detail::for_each_group;
using detail::GroupLayout;
using detail::layout_groups;

// Checks the per-group pointers: one non-null matrix per group.
template <typename Pointer>
void check_group_pointers(const GroupedGemmShape& shape, std::span<Pointer const> groups, const char* what) {
  if (groups.size() != shape.group_sizes.size())
    throw InternalError(std::string("grouped GEMM: ") + std::to_string(groups.size()) + " " + what + " pointers for " +
                        std::to_string(shape.group_sizes.size()) + " groups");
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (groups[g] == nullptr)
      throw InternalError(std::string("grouped GEMM: ") + what + " pointer of group " + std::to_string(g) + " is null");
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

void forward_groups(const GroupedGemmShape& shape, const float* x, std::span<const float* const> w_groups, float* out) {
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

void dlhs_groups(const GroupedGemmShape& shape, const float* dout, std::span<const float* const> w_groups, float* dx,
                 bool accumulate) {
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

void drhs_groups(const GroupedGemmShape& shape, const float* x, const float* dout, std::span<float* const> dw_groups) {
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

void grouped_gemm_forward(const GroupedGemmShape& shape, const float* x, std::span<const float* const> w_groups,
                          float* out) {
  check_group_pointers(shape, w_groups, "weight");
  forward_groups(shape, x, w_groups, out);
}

void grouped_gemm_dlhs(const GroupedGemmShape& shape, const float* dout, std::span<const float* const> w_groups,
                       float* dx, bool accumulate) {
  check_group_pointers(shape, w_groups, "weight");
  dlhs_groups(shape, dout, w_groups, dx, accumulate);
}

void grouped_gemm_drhs(const GroupedGemmShape& shape, const float* x, const float* dout,
                       std::span<float* const> dw_groups) {
  check_group_pointers(shape, dw_groups, "weight gradient");
  drhs_groups(shape, x, dout, dw_groups);
}

void grouped_gemm_forward(const GroupedGemmShape& shape, const float* x, const float* w, float* out) {
  forward_groups(shape, x, contiguous_groups(shape, w), out);
}

void grouped_gemm_dlhs(const GroupedGemmShape& shape, const float* dout, const float* w, float* dx, bool accumulate) {
  dlhs_groups(shape, dout, contiguous_groups(shape, w), dx, accumulate);
}

void grouped_gemm_drhs(const GroupedGemmShape& shape, const float* x, const float* dout, float* dw) {
  drhs_groups(shape, x, dout, contiguous_groups(shape, dw));
}

}  // namespace epmoe
