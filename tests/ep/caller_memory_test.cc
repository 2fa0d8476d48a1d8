// The layer computes on the caller's memory in place (issue 17): x, dy and
// every weight held in plain std::vector<float>, as an engine holding its own
// arrays would, reach MoeLayer as TensorViews; rank r's inputs are views of
// rows of the full arrays, not slices copied out.
//
// Topology: N = 6 tokens, H = 64, F = 128, E = 6 experts, K = 2. Ranks are
// threads, R = 1, 2, 3, one compute thread each; rank r holds tokens
// [r·N/R, (r+1)·N/R) and experts [r·E/R, (r+1)·E/R). Dispatchers: local (one
// rank, no communication), all-to-all and ring of experts at every R.
// Replicas are off: with balance=dynamic the replica slots legitimately
// receive copies of other ranks' hot experts (ep/replica_exchange.h), which
// is the point of a replica, not a copy of the caller's weights.
//
// What is held:
//  * allocations (core/buffer_cache.h counts every buffer epmoe's tensors
//    take, process-wide): the forward takes no buffer as large as the
//    smallest weight shard and fewer bytes in all than the weights; the
//    backward, beyond its dW outputs (exactly the weights' bytes), less than
//    the smallest shard. Token rows are few (N = 6), so activations are a
//    few KiB against shards of >= 64 KiB: any copy of any weight, on any
//    rank, breaks one of the bounds.
//  * numerics: y, the expert ids and every gradient match the double
//    reference (reference_moe.h) within 1e-5, as the Tensor-based runs do.
//  * a strided view of any input is refused before any work, naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <epmoe/moe_layer.h>
#include "comm/barrier.h"
#include "core/buffer_cache.h"
#include "ep/ep_config.h"
#include "ep_harness.h"
#include "expect_reference.h"
#include "reference_moe.h"
#include "single_rank_layer.h"
#include "transport/threads/launcher.h"

namespace epmoe::testing {
namespace {

constexpr std::int64_t kTokens = 6, kHidden = 64, kFfn = 128;
constexpr int kExperts = 6, kTopK = 2;

// The caller's arrays: std::vector memory, not epmoe Tensors.
struct CallerArrays {
  std::vector<float> x, dy, gate, wi0, wi1, wo;
};

std::vector<float> values_of(const Tensor& t) { return {t.span<float>().begin(), t.span<float>().end()}; }

CallerArrays caller_arrays(const MoeProblem& p) {
  return {values_of(p.x), values_of(p.dy), values_of(p.gate), values_of(p.wi0), values_of(p.wi1), values_of(p.wo)};
}

// One rank's inputs: views of rows [begin, end) of the caller's arrays.
struct RankViews {
  TensorView x, dy;
  MoeWeights weights;
};

RankViews rank_views(const CallerArrays& a, std::int64_t t0, std::int64_t t1, std::int64_t e0, std::int64_t e1) {
  const auto f32 = DType::f32;
  return {TensorView(a.x.data(), f32, {kTokens, kHidden}).rows(t0, t1),
          TensorView(a.dy.data(), f32, {kTokens, kHidden}).rows(t0, t1),
          {.gate = TensorView(a.gate.data(), f32, {kHidden, kExperts}),
           .wi0 = TensorView(a.wi0.data(), f32, {kExperts, kHidden, kFfn}).rows(e0, e1),
           .wi1 = TensorView(a.wi1.data(), f32, {kExperts, kHidden, kFfn}).rows(e0, e1),
           .wo = TensorView(a.wo.data(), f32, {kExperts, kFfn, kHidden}).rows(e0, e1)}};
}

enum class Dispatch { local, alltoall, ring };

struct Case {
  Dispatch dispatch;
  int num_ranks;
  std::string name() const {
    const char* kind = dispatch == Dispatch::local ? "local" : dispatch == Dispatch::alltoall ? "alltoall" : "ring";
    return std::string(kind) + " R=" + std::to_string(num_ranks);
  }
};

const Case kCases[] = {{Dispatch::local, 1}, {Dispatch::alltoall, 1}, {Dispatch::alltoall, 2}, {Dispatch::alltoall, 3},
                       {Dispatch::ring, 1},  {Dispatch::ring, 2},     {Dispatch::ring, 3}};

struct ViewRun {
  EpRunResult result;  // gathered into single-rank shapes, as the harness's
  BufferAllocationCounts forward, backward;
};

void copy_rows_into(Tensor& dst, std::int64_t begin, const Tensor& src) {
  const std::int64_t row_bytes = dst.dim(0) > 0 ? dst.size_bytes() / dst.dim(0) : 0;
  if (src.size_bytes() > 0)
    std::memcpy(static_cast<char*>(dst.raw()) + begin * row_bytes, src.raw(),
                static_cast<std::size_t>(src.size_bytes()));
}

MoeLayerConfig layer_config(const MoeProblem& p) { return {.hidden = kHidden, .ffn = kFfn, .router = p.router}; }

// One forward + backward on the caller's arrays; counts what each phase
// allocated over every rank (between barriers, so no rank's phase overlaps
// another's count).
ViewRun run_on_views(const MoeProblem& p, const CallerArrays& arrays, const Case& c) {
  const int num_ranks = c.num_ranks;
  ViewRun run{{Tensor(DType::f32, {kTokens, kHidden}),
               Tensor(DType::i32, {kTokens, kTopK}),
               Tensor(DType::f32, {kTokens, kTopK}),
               {Tensor(DType::f32, {kTokens, kHidden}), Tensor::zeros(DType::f32, {kHidden, kExperts}),
                Tensor(DType::f32, {kExperts, kHidden, kFfn}), Tensor(DType::f32, {kExperts, kHidden, kFfn}),
                Tensor(DType::f32, {kExperts, kFfn, kHidden})}},
              {},
              {}};
  std::mutex mutex;
  const auto gather = [&](std::int64_t t0, std::int64_t e0, const MoeForwardOutput& out, const MoeGradients& g) {
    const std::lock_guard lock(mutex);
    copy_rows_into(run.result.y, t0, out.y);
    copy_rows_into(run.result.topk_ids, t0, out.topk_ids);
    copy_rows_into(run.result.topk_weights, t0, out.topk_weights);
    copy_rows_into(run.result.grads.dx, t0, g.dx);
    copy_rows_into(run.result.grads.dwi0, e0, g.dwi0);
    copy_rows_into(run.result.grads.dwi1, e0, g.dwi1);
    copy_rows_into(run.result.grads.dwo, e0, g.dwo);
    float* dgate = run.result.grads.dgate.data<float>();
    for (std::int64_t i = 0; i < g.dgate.numel(); ++i) dgate[i] += g.dgate.data<float>()[i];
  };
  if (c.dispatch == Dispatch::local) {
    testing::SingleRankLayer layer(layer_config(p));
    const RankViews v = rank_views(arrays, 0, kTokens, 0, kExperts);
    reset_buffer_allocation_counts();
    const MoeForwardOutput out = layer.forward(v.x, v.weights);
    run.forward = buffer_allocation_counts();
    reset_buffer_allocation_counts();
    const MoeGradients grads = layer.backward(v.dy);
    run.backward = buffer_allocation_counts();
    gather(0, 0, out, grads);
    return run;
  }
  EpConfig config{.num_experts = kExperts, .top_k = kTopK, .hidden = kHidden};
  transport::threads::ThreadsOptions threads;
  threads.compute_threads_per_rank = 1;
  const auto dispatch = c.dispatch == Dispatch::alltoall ? DispatchKind::alltoall : DispatchKind::ring;
  transport::threads::run_ranks(num_ranks, threads, [&](transport::Communicator& comm) {
    const int r = comm.rank();
    const std::int64_t t0 = kTokens * r / num_ranks, t1 = kTokens * (r + 1) / num_ranks;
    const std::int64_t el = kExperts / num_ranks, e0 = r * el;
    const RankViews v = rank_views(arrays, t0, t1, e0, e0 + el);
    EpConfig group_config = config;
    group_config.dispatch = dispatch;
    EpGroup group(comm, group_config);
    MoeLayer layer(layer_config(p), group);
    // Rank 0 reads and resets the counts while every other rank waits
    // between two barriers (tags above the layer's [0, 1024)).
    const auto between_phases = [&](std::uint32_t tag, BufferAllocationCounts* counts) {
      comm::barrier(comm, {.tag = tag}).wait();
      if (r == 0) {
        if (counts != nullptr) *counts = buffer_allocation_counts();
        reset_buffer_allocation_counts();
      }
      comm::barrier(comm, {.tag = tag + 1}).wait();
    };
    between_phases(2000, nullptr);
    const MoeForwardOutput out = layer.forward(v.x, v.weights);
    between_phases(2002, &run.forward);
    const MoeGradients grads = layer.backward(v.dy);
    between_phases(2004, &run.backward);
    gather(t0, e0, out, grads);
  });
  return run;
}

MoeProblem problem() {
  return make_problem(kTokens, kHidden, kFfn,
                      {.kind = RouterKind::softmax_topk, .num_experts = kExperts, .top_k = kTopK}, 29);
}

TEST(CallerMemory, AStepOnViewsAllocatesNoCopyOfTheWeights) {
  const MoeProblem p = problem();
  const CallerArrays arrays = caller_arrays(p);
  // Every weight tensor is [E, H, F] or [E, F, H]: the same bytes.
  const std::int64_t weight_bytes = std::int64_t{kExperts} * kHidden * kFfn * 4;  // one of wi0, wi1, wo, all ranks
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name());
    const std::int64_t smallest_shard_bytes = weight_bytes / c.num_ranks;  // one rank's wi0 (or wi1, wo)
    const ViewRun run = run_on_views(p, arrays, c);
    std::printf(
        "%s: forward %lld buffers, %lld bytes (largest %lld); backward %lld buffers, %lld bytes; "
        "weight shard %lld bytes\n",
        c.name().c_str(), static_cast<long long>(run.forward.buffers), static_cast<long long>(run.forward.bytes),
        static_cast<long long>(run.forward.largest_bytes), static_cast<long long>(run.backward.buffers),
        static_cast<long long>(run.backward.bytes), static_cast<long long>(smallest_shard_bytes));
    EXPECT_GT(run.forward.buffers, 0);  // the counter sees the step (y, the routing, activations)
    EXPECT_LT(run.forward.largest_bytes, smallest_shard_bytes) << "a forward buffer the size of a weight shard";
    EXPECT_LT(run.forward.bytes, 3 * weight_bytes) << "the forward allocated the weights' bytes";
    // dwi0, dwi1 and dwo are the backward's outputs: 3 * weight_bytes over the ranks.
    EXPECT_GE(run.backward.bytes, 3 * weight_bytes);
    EXPECT_LT(run.backward.bytes - 3 * weight_bytes, smallest_shard_bytes)
        << "the backward allocated a weight shard's bytes beyond its weight gradients";
  }
}

TEST(CallerMemory, ViewsOfVectorMemoryMatchTheDoubleReference) {
  const MoeProblem p = problem();
  const CallerArrays arrays = caller_arrays(p);
  for (const Case& c : kCases) {
    const ViewRun run = run_on_views(p, arrays, c);
    expect_matches_reference(run.result, reference_moe(p, ids_of(run.result.topk_ids)), c.name());
  }
}

// A strided view of every input in turn (the same bytes read as a
// transposed or every-other-row layout): refused with UsageError naming the
// tensor and its strides, before any work, so the layer runs the next step.
TEST(CallerMemory, AStridedViewIsRefusedNamingTheTensor) {
  const MoeProblem p = problem();
  const CallerArrays arrays = caller_arrays(p);
  std::vector<float> extra_d_logits(kTokens * kExperts, 0.0f);
  const RankViews v = rank_views(arrays, 0, kTokens, 0, kExperts);
  const auto f32 = DType::f32;
  // [E, H, F] over a [E, F, H] array's bytes: the transpose of each matrix.
  const std::int64_t transposed[] = {kHidden * kFfn, 1, kHidden};
  const std::int64_t weight_shape[] = {kExperts, kHidden, kFfn};
  const TensorView strided_wi0(arrays.wi0.data(), f32, weight_shape, transposed);
  // Every other token row of x and dy: 3 rows with a stride of 2 rows.
  const std::int64_t half_rows[] = {kTokens / 2, kHidden}, every_other_row[] = {2 * kHidden, 1};
  const TensorView strided_x(arrays.x.data(), f32, half_rows, every_other_row);
  const std::int64_t gate_shape[] = {kHidden, kExperts}, gate_transposed[] = {1, kHidden};
  const TensorView strided_gate(arrays.gate.data(), f32, gate_shape, gate_transposed);
  const std::int64_t bias_shape[] = {kExperts}, bias_stride[] = {2};
  std::vector<float> wide_bias(2 * kExperts, 0.0f);
  const TensorView strided_bias(wide_bias.data(), f32, bias_shape, bias_stride);

  testing::SingleRankLayer layer(layer_config(p));
  const auto message_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(no UsageError)";
  };
  struct Refusal {
    const char* name;
    std::string message;
  };
  const auto with = [&](auto change) {
    MoeWeights w = v.weights;
    change(w);
    return w;
  };
  const std::vector<Refusal> refusals = {
      {"x", message_of([&] { layer.forward(strided_x, v.weights); })},
      {"gate", message_of([&] { layer.forward(v.x, with([&](MoeWeights& w) { w.gate = strided_gate; })); })},
      {"wi0", message_of([&] { layer.forward(v.x, with([&](MoeWeights& w) { w.wi0 = strided_wi0; })); })},
      {"wi1", message_of([&] {
         layer.forward(
             v.x, with([&](MoeWeights& w) { w.wi1 = TensorView(arrays.wi1.data(), f32, weight_shape, transposed); }));
       })},
      {"wo", message_of([&] {
         const std::int64_t wo_shape[] = {kExperts, kFfn, kHidden}, wo_transposed[] = {kHidden * kFfn, 1, kFfn};
         layer.forward(v.x,
                       with([&](MoeWeights& w) { w.wo = TensorView(arrays.wo.data(), f32, wo_shape, wo_transposed); }));
       })},
      {"bias", message_of([&] { layer.forward(v.x, with([&](MoeWeights& w) { w.bias = strided_bias; })); })},
  };
  for (const Refusal& refusal : refusals) {
    EXPECT_NE(refusal.message.find(std::string("moe layer: ") + refusal.name + " is not C-contiguous (shape ["),
              std::string::npos)
        << refusal.message;
    EXPECT_NE(refusal.message.find("strides ["), std::string::npos) << refusal.message;
  }
  EXPECT_NE(refusals[2].message.find("strides [8192, 1, 64]"), std::string::npos) << refusals[2].message;

  // The layer was left as it was: a step runs, and dy is held to the same rule.
  layer.forward(v.x, v.weights);
  const std::int64_t dy_shape[] = {kTokens, kHidden}, dy_transposed[] = {1, kTokens};
  const std::string dy_message =
      message_of([&] { layer.backward(TensorView(arrays.dy.data(), f32, dy_shape, dy_transposed)); });
  EXPECT_NE(dy_message.find("moe layer: dy is not C-contiguous"), std::string::npos) << dy_message;
  const std::int64_t logits_shape[] = {kTokens, kExperts}, logits_transposed[] = {1, kTokens};
  const std::string extra_message = message_of(
      [&] { layer.backward(v.dy, TensorView(extra_d_logits.data(), f32, logits_shape, logits_transposed)); });
  EXPECT_NE(extra_message.find("moe layer: extra_d_logits is not C-contiguous"), std::string::npos) << extra_message;
  const MoeGradients grads = layer.backward(v.dy);
  EXPECT_EQ(grads.dx.dim(0), kTokens);
}

}  // namespace
}  // namespace epmoe::testing
