#include "moe/local_experts.h"
#include "core/modelled_clock.h"

#include <string>
#include <tuple>

#include "comm/cooperative_progress.h"
#include "core/error.h"
#include "core/threading.h"
#include "kernels/gemm.h"
#include "kernels/grouped_gemm.h"
#include "kernels/swiglu.h"
#include "kernels/swiglu_up_projection.h"

namespace epmoe {
namespace {

// Between the expert GEMMs the rank's thread lends its core to the
// collectives it has in flight (the next chunk's dispatch, the previous
// chunk's combine) whose progress thread is due, so they move even when
// rank threads fill every core (comm/cooperative_progress.h; a few ns when
// nothing is due). Results do not change.
void lend_core_to_collectives() { comm::drive_progress(); }

// Rows of each slot in ascending row order (a stable counting sort by slot).
struct SlotRows {
  std::vector<std::int64_t> offsets;  // [num_slots + 1]
  std::vector<std::int64_t> rows;     // [num_rows]
};

SlotRows group_rows_by_slot(const ep::ExpertRows& rows) {
  SlotRows out;
  out.offsets.assign(static_cast<std::size_t>(rows.num_slots + 1), 0);
  for (std::int64_t slot : rows.slot_of_row) out.offsets[slot + 1] += 1;
  for (std::int64_t s = 0; s < rows.num_slots; ++s) out.offsets[s + 1] += out.offsets[s];
  out.rows.resize(rows.slot_of_row.size());
  std::vector<std::int64_t> next(out.offsets.begin(), out.offsets.end() - 1);
  for (std::size_t r = 0; r < rows.slot_of_row.size(); ++r)
    out.rows[next[rows.slot_of_row[r]]++] = static_cast<std::int64_t>(r);
  return out;
}

// dst += src elementwise over `count` floats (a chunk's weight gradient into
// the total; elementwise, so the split over threads does not change a bit).
void add_into(float* dst, const float* src, std::int64_t count) {
  const ComputeScope charge("accumulate weight gradients",
                            {.flops = static_cast<double>(count), .bytes = 12.0 * static_cast<double>(count)});
  parallel_for(count, 1 << 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) dst[i] += src[i];
  });
}

// One matrix pointer per group: the caller's per-group list when given,
// else base + g * matrix_elements.
std::vector<const float*> group_matrices(const float* base, const std::vector<const float*>& groups,
                                         std::size_t num_groups, std::int64_t matrix_elements, const char* name) {
  if (!groups.empty()) {
    if (groups.size() != num_groups)
      throw InternalError(std::string("local experts: ") + name + "_groups has " + std::to_string(groups.size()) +
                          " pointers for " + std::to_string(num_groups) + " groups of rows");
    return groups;
  }
  if (base == nullptr && num_groups > 0)
    throw InternalError(std::string("local experts: ") + name + " is null and " + name + "_groups empty");
  std::vector<const float*> out(num_groups);
  for (std::size_t g = 0; g < num_groups; ++g) out[g] = base + static_cast<std::int64_t>(g) * matrix_elements;
  return out;
}

void check_gradient_pointers(const std::vector<float*>& groups, std::size_t num_groups, const char* name) {
  if (groups.size() != num_groups)
    throw InternalError(std::string("local experts: ") + std::to_string(groups.size()) + " " + name +
                        " gradient pointers for " + std::to_string(num_groups) + " groups of rows");
}

// Group g's matrix inside a contiguous [G, a, b] tensor.
std::vector<float*> tensor_groups(const MutableTensorView& tensor, std::size_t num_groups, std::int64_t matrix_elements,
                                  const char* name) {
  if (tensor.numel() != static_cast<std::int64_t>(num_groups) * matrix_elements)
    throw InternalError(std::string("local experts: ") + name + " has " + std::to_string(tensor.numel()) +
                        " elements, not " + std::to_string(num_groups) + " groups of " +
                        std::to_string(matrix_elements));
  std::vector<float*> out(num_groups);
  for (std::size_t g = 0; g < num_groups; ++g)
    out[g] = tensor.data<float>() + static_cast<std::int64_t>(g) * matrix_elements;
  return out;
}

// The grouped products' shape; the weights' version lets the GEMMs keep
// what they derive from a weight matrix (its bf16 copy, its packed layout).
GroupedGemmShape gemm_shape(const ep::ExpertRows& rows, const ExpertShape& shape, const LocalExpertWeights& weights,
                            std::int64_t k, std::int64_t n) {
  return {.group_sizes = rows.group_sizes,
          .k = k,
          .n = n,
          .compute_dtype = shape.compute_dtype,
          .weight_version = weights.version,
          .pack_weights = shape.pack_weights};
}

// The three matrices' per-group pointers, resolved once per call.
struct GroupWeights {
  std::vector<const float*> wi0, wi1, wo;
};

GroupWeights group_weights(const ExpertShape& shape, const ep::ExpertRows& rows, const LocalExpertWeights& weights) {
  const std::size_t num_groups = rows.group_sizes.size();
  const std::int64_t elements = shape.hidden * shape.ffn;
  return {group_matrices(weights.wi0, weights.wi0_groups, num_groups, elements, "wi0"),
          group_matrices(weights.wi1, weights.wi1_groups, num_groups, elements, "wi1"),
          group_matrices(weights.wo, weights.wo_groups, num_groups, elements, "wo")};
}

}  // namespace

std::int64_t prepared_weight_bytes(const ExpertShape& shape, std::size_t num_groups,
                                   const LocalExpertWeights& weights) {
  const std::int64_t elements = shape.hidden * shape.ffn;
  std::vector<const float*> matrices;
  for (const auto& [base, groups, name] :
       {std::tuple{weights.wi0, &weights.wi0_groups, "wi0"}, std::tuple{weights.wi1, &weights.wi1_groups, "wi1"},
        std::tuple{weights.wo, &weights.wo_groups, "wo"}}) {
    const std::vector<const float*> group = group_matrices(base, *groups, num_groups, elements, name);
    matrices.insert(matrices.end(), group.begin(), group.end());
  }
  return gemm_weight_cache_bytes(matrices);
}

std::int64_t recompute_activations(const ExpertShape& shape, const ep::ExpertRows& rows,
                                   const LocalExpertWeights& weights, ExpertActivations& act) {
  const std::int64_t num_rows = rows.num_rows(), hidden = shape.hidden, ffn = shape.ffn;
  const GroupedGemmShape up = gemm_shape(rows, shape, weights, hidden, ffn);
  const GroupedGemmShape down = gemm_shape(rows, shape, weights, ffn, hidden);
  const float* x = num_rows > 0 ? rows.x.data<float>() : nullptr;
  const GroupWeights w = group_weights(shape, rows, weights);
  std::int64_t recomputed = 0;
  // A zero-row chunk has empty activations either way: nothing to recompute.
  auto missing = [](const Tensor& t) { return t.shape().empty(); };
  Tensor activation;  // SwiGLU(mlpwi_0, mlpwi_1), when the up projection already made it
  if (missing(act.mlpwi_0) && missing(act.mlpwi_1)) {
    // Both up products task by task, with the SwiGLU of each task's rows
    // from cache when mlpwo needs it too (kernels/swiglu_up_projection.h:
    // the same bits as two grouped products and a SwiGLU pass), or the
    // opt-in concatenated product.
    act.mlpwi_0 = Tensor(DType::f32, {num_rows, ffn});
    act.mlpwi_1 = Tensor(DType::f32, {num_rows, ffn});
    if (missing(act.mlpwo)) activation = Tensor(DType::f32, {num_rows, ffn});
    grouped_swiglu_up_projection(up, x, w.wi0, w.wi1, act.mlpwi_0.data<float>(), act.mlpwi_1.data<float>(),
                                 activation.shape().empty() ? nullptr : activation.data<float>(),
                                 shape.fuse_up_projection ? UpProjection::concatenated : UpProjection::two_products);
    lend_core_to_collectives();
    recomputed += act.mlpwi_0.size_bytes() + act.mlpwi_1.size_bytes();
  }
  if (missing(act.mlpwi_0)) {
    act.mlpwi_0 = Tensor(DType::f32, {num_rows, ffn});
    grouped_gemm_forward(up, x, w.wi0, act.mlpwi_0.data<float>());
    lend_core_to_collectives();
    recomputed += act.mlpwi_0.size_bytes();
  }
  if (missing(act.mlpwi_1)) {
    act.mlpwi_1 = Tensor(DType::f32, {num_rows, ffn});
    grouped_gemm_forward(up, x, w.wi1, act.mlpwi_1.data<float>());
    lend_core_to_collectives();
    recomputed += act.mlpwi_1.size_bytes();
  }
  if (missing(act.mlpwo)) {
    if (activation.shape().empty()) {
      activation = Tensor(DType::f32, {num_rows, ffn});
      swiglu_forward(act.mlpwi_0.data<float>(), act.mlpwi_1.data<float>(), activation.data<float>(), num_rows * ffn);
      lend_core_to_collectives();
    }
    act.mlpwo = Tensor(DType::f32, {num_rows, hidden});
    grouped_gemm_forward(down, activation.data<float>(), w.wo, act.mlpwo.data<float>());
    lend_core_to_collectives();
    recomputed += act.mlpwo.size_bytes();
  }
  return recomputed;
}

Tensor experts_forward(const ExpertShape& shape, const ep::ExpertRows& rows, const LocalExpertWeights& weights,
                       ExpertActivations& saved) {
  const std::int64_t hidden = shape.hidden;
  saved = ExpertActivations();
  recompute_activations(shape, rows, weights, saved);

  // Weighted sum of each slot's rows: every expert output row read once,
  // every slot row written once.
  Tensor slot_out(DType::f32, {rows.num_slots, hidden});
  const ComputeScope charge("combine weighted sum",
                            {.flops = 2.0 * static_cast<double>(rows.num_rows() * hidden),
                             .bytes = 4.0 * static_cast<double>((rows.num_rows() + rows.num_slots) * hidden)});
  const SlotRows by_slot = group_rows_by_slot(rows);
  const float* expert_out = saved.mlpwo.data<float>();
  float* out = slot_out.data<float>();
  parallel_for(rows.num_slots, 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t s = begin; s < end; ++s) {
      float* out_row = out + s * hidden;
      for (std::int64_t j = 0; j < hidden; ++j) out_row[j] = 0.0f;
      for (std::int64_t i = by_slot.offsets[s]; i < by_slot.offsets[s + 1]; ++i) {
        const std::int64_t r = by_slot.rows[i];
        const float w = rows.weights[r];
        const float* o_row = expert_out + r * hidden;
        for (std::int64_t j = 0; j < hidden; ++j) out_row[j] += w * o_row[j];
      }
    }
  });
  return slot_out;
}

ExpertGradients experts_backward(const ExpertShape& shape, const ep::ExpertRows& rows,
                                 const LocalExpertWeights& weights, const ExpertActivations& saved,
                                 const Tensor& slot_dy, const ExpertWeightGradients& dw, bool accumulate) {
  const std::int64_t num_rows = rows.num_rows(), hidden = shape.hidden, ffn = shape.ffn;
  EPMOE_CHECK_EQ(slot_dy.numel(), rows.num_slots * hidden);
  const std::size_t num_groups = rows.group_sizes.size();
  check_gradient_pointers(dw.dwi0, num_groups, "dwi0");
  check_gradient_pointers(dw.dwi1, num_groups, "dwi1");
  check_gradient_pointers(dw.dwo, num_groups, "dwo");
  const GroupWeights w = group_weights(shape, rows, weights);
  const GroupedGemmShape up = gemm_shape(rows, shape, weights, hidden, ffn);
  const GroupedGemmShape down = gemm_shape(rows, shape, weights, ffn, hidden);

  // Weighting backward: d(expert out)_r = w_r dy_slot(r); d(w_r) = <dy_slot(r), out_r>.
  ExpertGradients grads{Tensor(DType::f32, {rows.num_slots, hidden}),
                        std::vector<float>(static_cast<std::size_t>(num_rows))};
  Tensor d_expert_out(DType::f32, {num_rows, hidden});
  {
    // Per row: its slot's dy and its output read, its gradient written.
    const ComputeScope charge("combine backward", {.flops = 4.0 * static_cast<double>(num_rows * hidden),
                                                   .bytes = 12.0 * static_cast<double>(num_rows * hidden)});
    const float* dy = slot_dy.data<float>();
    const float* expert_out = saved.mlpwo.data<float>();
    float* d_out = d_expert_out.data<float>();
    parallel_for(num_rows, 16, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) {
        const float* dy_row = dy + rows.slot_of_row[r] * hidden;
        const float* o_row = expert_out + r * hidden;
        float* d_row = d_out + r * hidden;
        const float w = rows.weights[r];
        float dot = 0.0f;
        for (std::int64_t j = 0; j < hidden; ++j) {
          d_row[j] = w * dy_row[j];
          dot += dy_row[j] * o_row[j];
        }
        grads.row_dweights[r] = dot;
      }
    });
  }

  // The weight gradient of this chunk: straight into dW for the first chunk,
  // through a scratch buffer and an add for the others (a pass over dW that
  // the single-chunk case should not pay). All three matrices have H * F
  // elements, so one [G, H, F] scratch serves them in turn.
  const std::int64_t matrix_elements = hidden * ffn;
  Tensor chunk_dw = accumulate ? Tensor(DType::f32, {static_cast<std::int64_t>(num_groups), hidden, ffn}) : Tensor();
  std::vector<float*> chunk_groups(num_groups);
  for (std::size_t g = 0; g < num_groups; ++g)
    if (accumulate) chunk_groups[g] = chunk_dw.data<float>() + static_cast<std::int64_t>(g) * matrix_elements;
  auto weight_gradient = [&](const GroupedGemmShape& gemm_shape, const float* lhs, const float* dout,
                             const std::vector<float*>& dw_groups) {
    grouped_gemm_drhs(gemm_shape, lhs, dout, accumulate ? chunk_groups : dw_groups);
    lend_core_to_collectives();
    if (accumulate)
      for (std::size_t g = 0; g < num_groups; ++g) add_into(dw_groups[g], chunk_groups[g], matrix_elements);
  };
  Tensor d_activation(DType::f32, {num_rows, ffn});
  grouped_gemm_dlhs(down, d_expert_out.data<float>(), w.wo, d_activation.data<float>());
  lend_core_to_collectives();
  // dwo needs the activation, which the forward did not keep: the SwiGLU's
  // backward rebuilds it in its own pass over mlpwi_0 and mlpwi_1 (the same
  // bits as the forward's; a separate swiglu_forward pass took 15 ms of a
  // 349 ms backward at the single-rank layer's shape before it vectorised,
  // ~1.3 ms after: bench_expert_passes).
  Tensor activation(DType::f32, {num_rows, ffn});
  Tensor d_h0(DType::f32, {num_rows, ffn}), d_h1(DType::f32, {num_rows, ffn});
  swiglu_backward(saved.mlpwi_0.data<float>(), saved.mlpwi_1.data<float>(), d_activation.data<float>(),
                  d_h0.data<float>(), d_h1.data<float>(), num_rows * ffn, activation.data<float>());
  lend_core_to_collectives();
  weight_gradient(down, activation.data<float>(), d_expert_out.data<float>(), dw.dwo);
  const float* x = num_rows > 0 ? rows.x.data<float>() : nullptr;
  weight_gradient(up, x, d_h0.data<float>(), dw.dwi0);
  weight_gradient(up, x, d_h1.data<float>(), dw.dwi1);
  Tensor dx_rows(DType::f32, {num_rows, hidden});
  grouped_gemm_dlhs(up, d_h0.data<float>(), w.wi0, dx_rows.data<float>());
  lend_core_to_collectives();
  grouped_gemm_dlhs(up, d_h1.data<float>(), w.wi1, dx_rows.data<float>(), /*accumulate=*/true);
  lend_core_to_collectives();

  // Each slot's input gradient: the sum of its rows' (the backward of the
  // K-fold repeat; an inverse gather, no scatter-add).
  const SlotRows by_slot = group_rows_by_slot(rows);
  const float* dxr = dx_rows.data<float>();
  const ComputeScope charge("slot dx sum", {.flops = static_cast<double>(num_rows * hidden),
                                            .bytes = 4.0 * static_cast<double>((num_rows + rows.num_slots) * hidden)});
  float* slot_dx = grads.slot_dx.data<float>();
  parallel_for(rows.num_slots, 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t s = begin; s < end; ++s) {
      float* dst = slot_dx + s * hidden;
      for (std::int64_t j = 0; j < hidden; ++j) dst[j] = 0.0f;
      for (std::int64_t i = by_slot.offsets[s]; i < by_slot.offsets[s + 1]; ++i) {
        const float* src = dxr + by_slot.rows[i] * hidden;
        for (std::int64_t j = 0; j < hidden; ++j) dst[j] += src[j];
      }
    }
  });
  return grads;
}

ExpertGradients experts_backward(const ExpertShape& shape, const ep::ExpertRows& rows,
                                 const LocalExpertWeights& weights, const ExpertActivations& saved,
                                 const Tensor& slot_dy, MutableTensorView dwi0, MutableTensorView dwi1,
                                 MutableTensorView dwo, bool accumulate) {
  const std::size_t num_groups = rows.group_sizes.size();
  const std::int64_t elements = shape.hidden * shape.ffn;
  return experts_backward(
      shape, rows, weights, saved, slot_dy,
      {tensor_groups(dwi0, num_groups, elements, "dwi0"), tensor_groups(dwi1, num_groups, elements, "dwi1"),
       tensor_groups(dwo, num_groups, elements, "dwo")},
      accumulate);
}

}  // namespace epmoe
