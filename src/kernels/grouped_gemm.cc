#include "kernels/grouped_gemm.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threading.h"
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

// Whether forward (transpose_b false) or dlhs (true) runs as row blocks
// (RowBlocking in grouped_gemm.h); the product's inner size k and width n.
bool uses_row_blocks(const GroupedGemmShape& shape, std::int64_t n, std::int64_t k, bool transpose_b) {
  switch (shape.row_blocking) {
    case RowBlocking::always:
      return true;
    case RowBlocking::never:
      return false;
    case RowBlocking::automatic:
      break;
  }
  return shape.weight_version != 0 && gemm_packs_weights(kRowBlockRows, n, k, transpose_b, shape.compute_dtype);
}

// One task of the row-block task space: rows [first_row, first_row + rows)
// of the grouped matrix, all in group `group`.
struct RowBlock {
  int group;
  std::int64_t first_row, rows;
};

// Every group's rows in blocks of kRowBlockRows, the last one shorter; full
// blocks first, so that the short ones fill the threads' idle tail.
std::vector<RowBlock> row_blocks(const GroupedGemmShape& shape) {
  std::vector<RowBlock> blocks;
  std::int64_t row = 0;
  for (std::size_t g = 0; g < shape.group_sizes.size(); ++g) {
    const std::int64_t size = shape.group_sizes[g];
    EPMOE_CHECK_GE(size, 0);
    for (std::int64_t first = 0; first < size; first += kRowBlockRows)
      blocks.push_back({static_cast<int>(g), row + first, std::min(kRowBlockRows, size - first)});
    row += size;
  }
  std::stable_sort(blocks.begin(), blocks.end(), [](const RowBlock& a, const RowBlock& b) { return a.rows > b.rows; });
  return blocks;
}

// run_block(block) for every block, each on one thread: on the caller's
// when its budget is one thread (its modelled clock and trace track see the
// work), else spread over its threads.
template <typename RunBlock>
void run_row_blocks(const GroupedGemmShape& shape, const RunBlock& run_block) {
  const std::vector<RowBlock> blocks = row_blocks(shape);
  if (compute_threads() == 1) {
    for (const RowBlock& block : blocks) run_block(block);
  } else {
    detail::for_each_task(static_cast<std::int64_t>(blocks.size()), [&](std::int64_t i) { run_block(blocks[i]); });
  }
}

void forward_tasks(const GroupedGemmShape& shape, const float* x, std::span<const ForwardProduct> products,
                   const ForwardEpilogue& epilogue) {
  if (uses_row_blocks(shape, shape.n, shape.k, false)) {
    // Exact shapes: one fixed-shape primitive for every full block, and b
    // packed where oneDNN's layout for it is not plain.
    run_row_blocks(shape, [&](const RowBlock& block) {
      for (const ForwardProduct& product : products) {
        gemm({.a = x + block.first_row * shape.k,
              .b = product.w_groups[block.group],
              .c = product.out + block.first_row * shape.n,
              .m = block.rows,
              .n = shape.n,
              .k = shape.k,
              .compute_dtype = shape.compute_dtype,
              .b_version = shape.weight_version,
              .pack_b = true,
              .trace_name = "expert block forward"});
      }
      if (epilogue) epilogue(block.first_row, block.rows);
    });
    return;
  }
  const GroupLayout layout = layout_groups(shape);
  for_each_group(layout, [&](int g) {
    const std::int64_t row = layout.offsets[g], rows = shape.group_sizes[g];
    for (const ForwardProduct& product : products) {
      gemm({.a = x + row * shape.k,
            .b = product.w_groups[g],
            .c = product.out + row * shape.n,
            .m = rows,
            .n = shape.n,
            .k = shape.k,
            .compute_dtype = shape.compute_dtype,
            .dynamic_dim = GemmDynamicDim::m,
            .b_version = shape.weight_version,
            .pack_b = shape.pack_weights,
            .trace_name = "expert group forward"});
    }
    if (epilogue && rows > 0) epilogue(row, rows);
  });
}

void forward_groups(const GroupedGemmShape& shape, const float* x, std::span<const float* const> w_groups, float* out) {
  const ForwardProduct product{w_groups, out};
  forward_tasks(shape, x, {&product, 1}, nullptr);
}

void dlhs_groups(const GroupedGemmShape& shape, const float* dout, std::span<const float* const> w_groups, float* dx,
                 bool accumulate) {
  if (uses_row_blocks(shape, shape.k, shape.n, true)) {
    run_row_blocks(shape, [&](const RowBlock& block) {
      gemm({.a = dout + block.first_row * shape.n,
            .b = w_groups[block.group],  // W_g stored [k, n], used as W_g^T
            .c = dx + block.first_row * shape.k,
            .m = block.rows,
            .n = shape.k,
            .k = shape.n,
            .transpose_b = true,
            .accumulate = accumulate,
            .compute_dtype = shape.compute_dtype,
            .b_version = shape.weight_version,
            .pack_b = true,
            .trace_name = "expert block dgrad"});
    });
    return;
  }
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

bool forward_uses_row_blocks(const GroupedGemmShape& shape) { return uses_row_blocks(shape, shape.n, shape.k, false); }

void grouped_gemm_forward_tasks(const GroupedGemmShape& shape, const float* x, std::span<const ForwardProduct> products,
                                const ForwardEpilogue& epilogue) {
  for (const ForwardProduct& product : products) check_group_pointers(shape, product.w_groups, "weight");
  forward_tasks(shape, x, products, epilogue);
}

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
