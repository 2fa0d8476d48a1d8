#include "moe/local_experts.h"

#include "core/error.h"
#include "core/threading.h"
#include "kernels/grouped_gemm.h"
#include "kernels/swiglu.h"

namespace epmoe {
namespace {

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

// dst += src elementwise (the chunk's weight gradient into the total).
void add_into(Tensor& dst, const Tensor& src) {
  float* d = dst.data<float>();
  const float* s = src.data<float>();
  parallel_for(dst.numel(), 1 << 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) d[i] += s[i];
  });
}

}  // namespace

std::int64_t recompute_activations(const ExpertShape& shape, const ep::ExpertRows& rows,
                                   const LocalExpertWeights& weights, ExpertActivations& act) {
  const std::int64_t num_rows = rows.num_rows(), hidden = shape.hidden, ffn = shape.ffn;
  const GroupedGemmShape up{rows.group_sizes, hidden, ffn, shape.compute_dtype};
  const GroupedGemmShape down{rows.group_sizes, ffn, hidden, shape.compute_dtype};
  const float* x = num_rows > 0 ? rows.x.data<float>() : nullptr;
  std::int64_t recomputed = 0;
  // A zero-row chunk has empty activations either way: nothing to recompute.
  auto missing = [](const Tensor& t) { return t.shape().empty(); };
  if (missing(act.mlpwi_0)) {
    act.mlpwi_0 = Tensor(DType::f32, {num_rows, ffn});
    grouped_gemm_forward(up, x, weights.wi0, act.mlpwi_0.data<float>());
    recomputed += act.mlpwi_0.size_bytes();
  }
  if (missing(act.mlpwi_1)) {
    act.mlpwi_1 = Tensor(DType::f32, {num_rows, ffn});
    grouped_gemm_forward(up, x, weights.wi1, act.mlpwi_1.data<float>());
    recomputed += act.mlpwi_1.size_bytes();
  }
  if (missing(act.mlpwo)) {
    Tensor activation(DType::f32, {num_rows, ffn});
    swiglu_forward(act.mlpwi_0.data<float>(), act.mlpwi_1.data<float>(), activation.data<float>(),
                   num_rows * ffn);
    act.mlpwo = Tensor(DType::f32, {num_rows, hidden});
    grouped_gemm_forward(down, activation.data<float>(), weights.wo, act.mlpwo.data<float>());
    recomputed += act.mlpwo.size_bytes();
  }
  return recomputed;
}

Tensor experts_forward(const ExpertShape& shape, const ep::ExpertRows& rows,
                       const LocalExpertWeights& weights, ExpertActivations& saved) {
  const std::int64_t hidden = shape.hidden;
  saved = ExpertActivations();
  recompute_activations(shape, rows, weights, saved);

  // Weighted sum of each slot's rows.
  Tensor slot_out(DType::f32, {rows.num_slots, hidden});
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
                                 const Tensor& slot_dy, Tensor& dwi0, Tensor& dwi1, Tensor& dwo,
                                 bool accumulate) {
  const std::int64_t num_rows = rows.num_rows(), hidden = shape.hidden, ffn = shape.ffn;
  EPMOE_CHECK_EQ(slot_dy.numel(), rows.num_slots * hidden);
  const GroupedGemmShape up{rows.group_sizes, hidden, ffn, shape.compute_dtype};
  const GroupedGemmShape down{rows.group_sizes, ffn, hidden, shape.compute_dtype};

  // Weighting backward: d(expert out)_r = w_r dy_slot(r); d(w_r) = <dy_slot(r), out_r>.
  ExpertGradients grads{Tensor(DType::f32, {rows.num_slots, hidden}),
                        std::vector<float>(static_cast<std::size_t>(num_rows))};
  Tensor d_expert_out(DType::f32, {num_rows, hidden});
  {
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

  Tensor activation(DType::f32, {num_rows, ffn});
  swiglu_forward(saved.mlpwi_0.data<float>(), saved.mlpwi_1.data<float>(), activation.data<float>(),
                 num_rows * ffn);
  // The weight gradient of this chunk: straight into dW for the first chunk,
  // through a scratch buffer and an add for the others (a pass over dW that
  // the single-chunk case should not pay).
  Tensor chunk_dw = accumulate ? Tensor(DType::f32, dwo.shape()) : Tensor();
  auto weight_gradient = [&](const GroupedGemmShape& gemm_shape, const float* lhs, const float* dout, Tensor& dw) {
    grouped_gemm_drhs(gemm_shape, lhs, dout, accumulate ? chunk_dw.data<float>() : dw.data<float>());
    if (accumulate) add_into(dw, chunk_dw);
  };
  weight_gradient(down, activation.data<float>(), d_expert_out.data<float>(), dwo);
  Tensor d_activation(DType::f32, {num_rows, ffn});
  grouped_gemm_dlhs(down, d_expert_out.data<float>(), weights.wo, d_activation.data<float>());
  Tensor d_h0(DType::f32, {num_rows, ffn}), d_h1(DType::f32, {num_rows, ffn});
  swiglu_backward(saved.mlpwi_0.data<float>(), saved.mlpwi_1.data<float>(), d_activation.data<float>(),
                  d_h0.data<float>(), d_h1.data<float>(), num_rows * ffn);
  const float* x = num_rows > 0 ? rows.x.data<float>() : nullptr;
  if (accumulate) chunk_dw = Tensor(DType::f32, dwi0.shape());
  weight_gradient(up, x, d_h0.data<float>(), dwi0);
  weight_gradient(up, x, d_h1.data<float>(), dwi1);
  Tensor dx_rows(DType::f32, {num_rows, hidden});
  grouped_gemm_dlhs(up, d_h0.data<float>(), weights.wi0, dx_rows.data<float>());
  grouped_gemm_dlhs(up, d_h1.data<float>(), weights.wi1, dx_rows.data<float>(), /*accumulate=*/true);

  // Each slot's input gradient: the sum of its rows' (the backward of the
  // K-fold repeat; an inverse gather, no scatter-add).
  const SlotRows by_slot = group_rows_by_slot(rows);
  const float* dxr = dx_rows.data<float>();
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

}  // namespace epmoe
