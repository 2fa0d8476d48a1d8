// The public per-rank group (<epmoe/ep_group.h>) and layer steps under
// expert parallelism:
//  * ranks constructed with different configurations are refused at
//    construction, on every rank, naming the rank and the key (never a
//    hang);
//  * dispatch / combine without the experts (the caller's own expert
//    compute, here a plain double loop) and both backwards match a double
//    reference of the same routing, for every dispatcher;
//  * two micro-batches in flight on one layer give each its own bits; with
//    replicas the layer refuses a second step while one is in flight.
// Topology: ranks as threads (run_ranks), one compute thread each; R in
// {1, 2, 3}; rank r holds tokens [r*N/R, (r+1)*N/R) and experts
// [r*E/R, (r+1)*E/R).
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include <epmoe/ep_group.h>
#include <epmoe/moe_layer.h>

#include "ep_harness.h"
#include "moe/router.h"
#include "reference_moe.h"
#include "transport/threads/launcher.h"

namespace epmoe::testing {
namespace {

// Every rank's ConfigError text (empty: no error).
std::vector<std::string> construct_groups(int num_ranks, const std::function<EpConfig(int rank)>& config_of) {
  std::vector<std::string> messages(static_cast<std::size_t>(num_ranks));
  transport::threads::run_ranks(num_ranks, {.compute_threads_per_rank = 1}, [&](transport::Communicator& comm) {
    try {
      EpGroup group(comm, config_of(comm.rank()));
    } catch (const ConfigError& e) {
      messages[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  return messages;
}

TEST(EpGroup, RanksWithDifferentConfigurationsAreRefusedOnEveryRankNamingTheRankAndTheKey) {
  const EpConfig base{.num_experts = 6, .top_k = 2, .hidden = 8, .timeout = std::chrono::milliseconds(20'000)};
  struct Case {
    const char* key;
    std::function<void(EpConfig&)> change;
    const char* expected;
  };
  const Case cases[] = {
      {"top_k", [](EpConfig& c) { c.top_k = 3; }, "rank 1 has top_k=3 but rank 0 has top_k=2"},
      {"num_experts", [](EpConfig& c) { c.num_experts = 9; }, "rank 1 has num_experts=9 but rank 0 has num_experts=6"},
      {"hidden", [](EpConfig& c) { c.hidden = 16; }, "rank 1 has hidden=16 but rank 0 has hidden=8"},
      {"dispatch", [](EpConfig& c) { c.dispatch = DispatchKind::ring; },
       "rank 1 has dispatch=ring but rank 0 has dispatch=alltoall"},
      {"token_chunks", [](EpConfig& c) { c.num_chunks = 2; },
       "rank 1 has token_chunks=2 but rank 0 has token_chunks=1"},
      {"wire_dtype", [](EpConfig& c) { c.wire_dtype = WireDType::bf16; },
       "rank 1 has wire_dtype=bf16 but rank 0 has wire_dtype=f32"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    const std::vector<std::string> messages = construct_groups(3, [&](int rank) {
      EpConfig config = base;
      if (rank == 1) c.change(config);
      return config;
    });
    for (int r = 0; r < 3; ++r) {
      EXPECT_NE(messages[r].find(c.expected), std::string::npos) << "rank " << r << ": '" << messages[r] << "'";
    }
  }
  // The same configuration everywhere is accepted; one that no rank count
  // allows is refused by its own rule on every rank.
  EXPECT_EQ(construct_groups(3, [&](int) { return base; }), std::vector<std::string>(3));
  const std::vector<std::string> invalid = construct_groups(4, [&](int) { return base; });
  for (const std::string& message : invalid) EXPECT_NE(message.find("must divide num_experts=6"), std::string::npos);
}

// --- dispatch-only ----------------------------------------------------------

double silu(double z) { return z / (1.0 + std::exp(-z)); }
double silu_grad(double z) {
  const double s = 1.0 / (1.0 + std::exp(-z));
  return s * (1.0 + z * (1.0 - s));
}

// The caller's own expert compute, in double: out = (silu(x wi0) * (x wi1)) wo
// of global expert `e`, and its input gradient for d_out.
struct PlainExperts {
  const MoeProblem& p;
  void forward(int e, const float* x, float* out) const {
    const std::int64_t h = p.hidden, f = p.ffn;
    std::vector<double> act(static_cast<std::size_t>(f));
    for (std::int64_t j = 0; j < f; ++j) {
      double a = 0, b = 0;
      for (std::int64_t i = 0; i < h; ++i) {
        a += double(x[i]) * p.wi0.data<float>()[(e * h + i) * f + j];
        b += double(x[i]) * p.wi1.data<float>()[(e * h + i) * f + j];
      }
      act[j] = silu(a) * b;
    }
    for (std::int64_t o = 0; o < h; ++o) {
      double sum = 0;
      for (std::int64_t j = 0; j < f; ++j) sum += act[j] * p.wo.data<float>()[(e * f + j) * h + o];
      out[o] = static_cast<float>(sum);
    }
  }
  void backward(int e, const float* x, const float* d_out, float* dx) const {
    const std::int64_t h = p.hidden, f = p.ffn;
    std::vector<double> a(f), b(f);
    for (std::int64_t j = 0; j < f; ++j) {
      for (std::int64_t i = 0; i < h; ++i) {
        a[j] += double(x[i]) * p.wi0.data<float>()[(e * h + i) * f + j];
        b[j] += double(x[i]) * p.wi1.data<float>()[(e * h + i) * f + j];
      }
    }
    std::vector<double> da(f), db(f);
    for (std::int64_t j = 0; j < f; ++j) {
      double d_act = 0;
      for (std::int64_t o = 0; o < h; ++o) d_act += double(d_out[o]) * p.wo.data<float>()[(e * f + j) * h + o];
      da[j] = d_act * b[j] * silu_grad(a[j]);
      db[j] = d_act * silu(a[j]);
    }
    for (std::int64_t i = 0; i < h; ++i) {
      double sum = 0;
      for (std::int64_t j = 0; j < f; ++j)
        sum += da[j] * p.wi0.data<float>()[(e * h + i) * f + j] + db[j] * p.wi1.data<float>()[(e * h + i) * f + j];
      dx[i] = static_cast<float>(sum);
    }
  }
};

double relative(const float* got, const std::vector<double>& want) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

TEST(EpGroup, DispatchAndCombineWithTheCallersExpertsMatchADoubleReference) {
  const RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 6, .top_k = 2};
  const MoeProblem p = make_problem(23, 8, 10, router, 31);
  const PlainExperts experts{p};
  struct Variant {
    const char* name;
    DispatchKind dispatch;
    bool dedup;
    TokenFormat format;
  };
  for (const Variant& v : {Variant{"alltoall", DispatchKind::alltoall, false, TokenFormat::f32},
                           Variant{"alltoall dedup", DispatchKind::alltoall, true, TokenFormat::f32},
                           Variant{"ring", DispatchKind::ring, false, TokenFormat::f32}}) {
    for (const int num_ranks : {1, 2, 3}) {
      SCOPED_TRACE(std::string(v.name) + " R=" + std::to_string(num_ranks));
      std::vector<double> errors(static_cast<std::size_t>(num_ranks) * 3, -1);
      transport::threads::run_ranks(num_ranks, {.compute_threads_per_rank = 1}, [&](transport::Communicator& comm) {
        const int r = comm.rank();
        const std::int64_t t0 = p.num_tokens * r / num_ranks, t1 = p.num_tokens * (r + 1) / num_ranks, n = t1 - t0;
        const std::int64_t h = p.hidden;
        EpGroup group(comm, {.dispatch = v.dispatch, .num_experts = 6, .top_k = 2, .hidden = h, .dedup = v.dedup});
        const TensorView x = p.x.view().rows(t0, t1), dy = p.dy.view().rows(t0, t1);
        const RouterOutput routing = Router(p.router).forward(x, p.gate);
        Dispatched d = group.dispatch(x, routing.topk_ids, routing.topk_weights);
        // The caller's experts on the received rows, expert by expert.
        const std::int64_t num_rows = d.x.dim(0);
        Tensor out(DType::f32, {num_rows, h}), d_rows(DType::f32, {num_rows, h});
        std::vector<int> expert_of_row;
        for (int e = 0; e < group.num_local_experts(); ++e)
          for (std::int64_t i = 0; i < d.num_rows_per_expert[e]; ++i)
            expert_of_row.push_back(group.first_local_expert() + e);
        EPMOE_CHECK_EQ(static_cast<std::int64_t>(expert_of_row.size()), num_rows);
        for (std::int64_t row = 0; row < num_rows; ++row)
          experts.forward(expert_of_row[row], d.x.data<float>() + row * h, out.data<float>() + row * h);
        const Tensor y = group.combine(d.handle, out);
        const CombineGradients gc = group.combine_backward(d.handle, dy, out);
        for (std::int64_t row = 0; row < num_rows; ++row)
          experts.backward(expert_of_row[row], d.x.data<float>() + row * h, gc.d_expert_outputs.data<float>() + row * h,
                           d_rows.data<float>() + row * h);
        const DispatchGradients gd = group.dispatch_backward(d.handle, d_rows, gc.d_row_weights);

        // The reference on this rank's tokens, the same routing, in double.
        std::vector<double> y_ref(n * h, 0.0), dx_ref(n * h, 0.0), dw_ref(n * 2, 0.0);
        std::vector<float> expert_out(h), expert_dx(h), scaled(h);
        for (std::int64_t t = 0; t < n; ++t)
          for (int k = 0; k < 2; ++k) {
            const int e = routing.topk_ids.data<std::int32_t>()[t * 2 + k];
            const double w = routing.topk_weights.data<float>()[t * 2 + k];
            experts.forward(e, x.data<float>() + t * h, expert_out.data());
            for (std::int64_t j = 0; j < h; ++j) {
              y_ref[t * h + j] += w * expert_out[j];
              dw_ref[t * 2 + k] += double(dy.data<float>()[t * h + j]) * expert_out[j];
              scaled[j] = static_cast<float>(w * dy.data<float>()[t * h + j]);
            }
            experts.backward(e, x.data<float>() + t * h, scaled.data(), expert_dx.data());
            for (std::int64_t j = 0; j < h; ++j) dx_ref[t * h + j] += expert_dx[j];
          }
        errors[r * 3 + 0] = relative(y.data<float>(), y_ref);
        errors[r * 3 + 1] = relative(gd.dx.data<float>(), dx_ref);
        errors[r * 3 + 2] = relative(gd.d_topk_weights.data<float>(), dw_ref);
      });
      for (int r = 0; r < num_ranks; ++r) {
        EXPECT_LE(errors[r * 3 + 0], 1e-5) << "rank " << r << " y";
        EXPECT_LE(errors[r * 3 + 1], 1e-5) << "rank " << r << " dx";
        EXPECT_LE(errors[r * 3 + 2], 1e-5) << "rank " << r << " d_topk_weights";
        EXPECT_GE(errors[r * 3 + 0], 0) << "rank " << r << " did not run";
      }
    }
  }
}

TEST(EpGroup, DispatchOnlyCallsOutOfOrderAreRefusedNamingTheCall) {
  const RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 2};
  const MoeProblem p = make_problem(6, 8, 8, router, 3);
  EpGroup group(EpConfig{.num_experts = 4, .top_k = 2, .hidden = 8});
  const RouterOutput routing = Router(p.router).forward(p.x, p.gate);
  Dispatched d = group.dispatch(p.x, routing.topk_ids, routing.topk_weights);
  const Tensor out = d.x.clone();
  const auto refused = [](auto call, const std::string& expected) {
    try {
      call();
      ADD_FAILURE() << "accepted: " << expected;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  refused([&] { group.combine_backward(d.handle, p.dy, out); },
          "combine_backward() out of order: the handle's next call is combine");
  refused([&] { group.dispatch_backward(d.handle, out, d.weights); }, "dispatch_backward() out of order");
  group.combine(d.handle, out);
  refused([&] { group.combine(d.handle, out); }, "combine() out of order: the handle's next call is combine_backward");
  const CombineGradients gc = group.combine_backward(d.handle, p.dy, out);
  group.dispatch_backward(d.handle, gc.d_expert_outputs, gc.d_row_weights);
  refused([&] { group.combine(d.handle, out); }, "combine() on an empty dispatch handle");
  // Out-of-range physical experts are refused naming the element.
  Tensor bad = routing.topk_ids.clone();
  bad.data<std::int32_t>()[3] = 4;
  refused([&] { group.dispatch(p.x, bad, routing.topk_weights); },
          "topk_ids[1, 1] = 4 is not a physical expert in [0, 4)");
  EXPECT_EQ(group.steps_in_flight(), 0);
}

// A view with a null data pointer and elements, as any argument of the
// dispatch-only calls, is refused naming it and its shape before anything
// reads it (before: a segfault); the step goes on with the right views.
TEST(EpGroup, NullViewsAreRefusedNamingTheArgument) {
  const RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 2};
  const MoeProblem p = make_problem(6, 8, 8, router, 3);
  EpGroup group(EpConfig{.num_experts = 4, .top_k = 2, .hidden = 8});
  const RouterOutput routing = Router(p.router).forward(p.x, p.gate);
  const auto null_like = [](const Tensor& t) {
    return TensorView(static_cast<const void*>(nullptr), t.dtype(), t.shape());
  };
  const auto refused = [](auto call, const std::string& expected) {
    try {
      call();
      ADD_FAILURE() << "accepted: " << expected;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  refused([&] { group.dispatch(null_like(p.x), routing.topk_ids, routing.topk_weights); },
          "EP group: x: null data pointer for a 6x8 view");
  refused([&] { group.dispatch(p.x, null_like(routing.topk_ids), routing.topk_weights); },
          "EP group: topk_ids: null data pointer for a 6x2 view");
  refused([&] { group.dispatch(p.x, routing.topk_ids, null_like(routing.topk_weights)); },
          "EP group: topk_weights: null data pointer for a 6x2 view");
  Dispatched d = group.dispatch(p.x, routing.topk_ids, routing.topk_weights);
  const Tensor out = d.x.clone();
  const std::string rows = std::to_string(d.x.shape()[0]);
  refused([&] { group.combine(d.handle, null_like(out)); },
          "EP group: expert_outputs: null data pointer for a " + rows + "x8 view");
  refused(
      [&] {
        group.combine(d.handle, out, MutableTensorView(static_cast<float*>(nullptr), {6, 8}));
      },
      "EP group: y: null data pointer for a 6x8 view");
  group.combine(d.handle, out);
  refused([&] { group.combine_backward(d.handle, null_like(p.dy), out); },
          "EP group: dy: null data pointer for a 6x8 view");
  refused([&] { group.combine_backward(d.handle, p.dy, null_like(out)); },
          "EP group: expert_outputs: null data pointer for a " + rows + "x8 view");
  const CombineGradients gc = group.combine_backward(d.handle, p.dy, out);
  refused([&] { group.dispatch_backward(d.handle, null_like(gc.d_expert_outputs), gc.d_row_weights); },
          "EP group: d_rows: null data pointer for a " + rows + "x8 view");
  refused([&] { group.dispatch_backward(d.handle, gc.d_expert_outputs, null_like(gc.d_row_weights)); },
          "EP group: d_row_weights: null data pointer for a view of " + rows + " elements");
  group.dispatch_backward(d.handle, gc.d_expert_outputs, gc.d_row_weights);
  EXPECT_EQ(group.steps_in_flight(), 0);
}

// --- micro-batches ------------------------------------------------------------

TEST(EpGroup, TwoMicroBatchesInFlightOnOneLayerGiveEachItsOwnBits) {
  const RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 6, .top_k = 2};
  const MoeProblem a = make_problem(25, 8, 10, router, 41), b = make_problem(19, 8, 10, router, 42);
  const MoeLayerConfig layer_config{.hidden = 8, .ffn = 10, .router = router};
  struct Variant {
    const char* name;
    EpConfig ep;
  };
  for (const Variant& v :
       {Variant{"alltoall dedup chunks=2", {.num_experts = 6, .top_k = 2, .hidden = 8, .num_chunks = 2, .dedup = true}},
        Variant{"ring chunks=3",
                {.dispatch = DispatchKind::ring, .num_experts = 6, .top_k = 2, .hidden = 8, .num_chunks = 3}}}) {
    for (const int num_ranks : {2, 3}) {
      SCOPED_TRACE(std::string(v.name) + " R=" + std::to_string(num_ranks));
      std::vector<int> mismatches(static_cast<std::size_t>(num_ranks), -1);
      transport::threads::run_ranks(num_ranks, {.compute_threads_per_rank = 1}, [&](transport::Communicator& comm) {
        const int r = comm.rank();
        const std::int64_t el = 6 / num_ranks;
        const auto shard = [&](const MoeProblem& p) {
          return std::pair{p.x.view().rows(p.num_tokens * r / num_ranks, p.num_tokens * (r + 1) / num_ranks),
                           p.dy.view().rows(p.num_tokens * r / num_ranks, p.num_tokens * (r + 1) / num_ranks)};
        };
        const auto [xa, dya] = shard(a);
        const auto [xb, dyb] = shard(b);
        const MoeWeights w{a.gate,
                           a.wi0.view().rows(r * el, (r + 1) * el),
                           a.wi1.view().rows(r * el, (r + 1) * el),
                           a.wo.view().rows(r * el, (r + 1) * el),
                           {}};
        EpGroup group(comm, v.ep);
        MoeLayer sequential(layer_config, group), overlapped(layer_config, group);
        const MoeForwardOutput ya = sequential.forward(xa, w);
        const MoeGradients ga = sequential.backward(dya);
        const MoeForwardOutput yb = sequential.forward(xb, w);
        const MoeGradients gb = sequential.backward(dyb);
        // Both forwards, then the backwards in the other order.
        MoeStep step_a = overlapped.begin_forward(xa, w);
        MoeStep step_b = overlapped.begin_forward(xb, w);
        const MoeForwardOutput ob = overlapped.finish_forward(step_b);
        const MoeForwardOutput oa = overlapped.finish_forward(step_a);
        overlapped.begin_backward(step_b, dyb);
        overlapped.begin_backward(step_a, dya);
        const MoeGradients hb = overlapped.finish_backward(step_b);
        const MoeGradients ha = overlapped.finish_backward(step_a);
        int mismatch = 0;
        mismatch += !same_bits(ya.y, oa.y) + !same_bits(yb.y, ob.y);
        mismatch += !same_bits(ga.dx, ha.dx) + !same_bits(gb.dx, hb.dx);
        mismatch += !same_bits(ga.dgate, ha.dgate) + !same_bits(gb.dgate, hb.dgate);
        mismatch += !same_bits(ga.dwi0, ha.dwi0) + !same_bits(gb.dwo, hb.dwo);
        mismatches[r] = mismatch;
        EPMOE_CHECK_EQ(group.steps_in_flight(), 0);
      });
      for (int r = 0; r < num_ranks; ++r) EXPECT_EQ(mismatches[r], 0) << "rank " << r;
    }
  }
}

TEST(EpGroup, WithReplicasALayerHoldsOneStepAtATime) {
  const RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 2};
  const MoeProblem p = make_problem(16, 8, 8, router, 43);
  std::vector<std::string> refusals(2);
  transport::threads::run_ranks(2, {.compute_threads_per_rank = 1}, [&](transport::Communicator& comm) {
    const int r = comm.rank();
    EpGroup group(comm,
                  {.num_experts = 4, .top_k = 2, .hidden = 8, .balance = BalanceMode::dynamic, .redundant_slots = 1});
    MoeLayer layer({.hidden = 8, .ffn = 8, .router = router}, group);
    const MoeWeights w{p.gate,
                       p.wi0.view().rows(2 * r, 2 * r + 2),
                       p.wi1.view().rows(2 * r, 2 * r + 2),
                       p.wo.view().rows(2 * r, 2 * r + 2),
                       {}};
    const TensorView x = p.x.view().rows(8 * r, 8 * r + 8), dy = p.dy.view().rows(8 * r, 8 * r + 8);
    MoeStep first = layer.begin_forward(x, w);
    try {
      MoeStep second = layer.begin_forward(x, w);
    } catch (const UsageError& e) {
      refusals[r] = e.what();
    }
    layer.finish_forward(first);
    layer.begin_backward(first, dy);
    layer.finish_backward(first);
    MoeStep next = layer.begin_forward(x, w);  // the step ended: the next is welcome
    layer.finish_forward(next);
  });
  for (const std::string& message : refusals)
    EXPECT_NE(message.find("begin_forward() while another step of this layer is in flight: with replicas"),
              std::string::npos)
        << message;
}

// The group keeps its exchange buffers once per rank, shared by every layer:
// after one layer's step, the steps of a second and a third layer on the
// same group (and more steps of the first) leave its pooled bytes as they
// were; two micro-batches in flight need at most two sets.
TEST(EpGroup, LayersShareTheGroupsBuffers) {
  const RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 6, .top_k = 2};
  const MoeProblem p = make_problem(40, 16, 12, router, 51);
  const MoeLayerConfig layer_config{.hidden = 16, .ffn = 12, .router = router};
  std::vector<std::int64_t> after_one(2), after_three(2), with_two_in_flight(2);
  transport::threads::run_ranks(2, {.compute_threads_per_rank = 1}, [&](transport::Communicator& comm) {
    const int r = comm.rank();
    EpGroup group(comm, {.num_experts = 6, .top_k = 2, .hidden = 16, .num_chunks = 2, .dedup = true});
    MoeLayer first(layer_config, group), second(layer_config, group), third(layer_config, group);
    const MoeWeights w{p.gate,
                       p.wi0.view().rows(3 * r, 3 * r + 3),
                       p.wi1.view().rows(3 * r, 3 * r + 3),
                       p.wo.view().rows(3 * r, 3 * r + 3),
                       {}};
    const TensorView x = p.x.view().rows(20 * r, 20 * r + 20), dy = p.dy.view().rows(20 * r, 20 * r + 20);
    const auto step = [&](MoeLayer& layer) {
      layer.forward(x, w);
      layer.backward(dy);
    };
    step(first);
    after_one[r] = group.buffer_bytes();
    for (int i = 0; i < 3; ++i) {
      step(second);
      step(third);
      step(first);
    }
    after_three[r] = group.buffer_bytes();
    MoeStep a = first.begin_forward(x, w), b = second.begin_forward(x, w);
    first.finish_forward(a);
    second.finish_forward(b);
    first.begin_backward(a, dy);
    second.begin_backward(b, dy);
    first.finish_backward(a);
    second.finish_backward(b);
    with_two_in_flight[r] = group.buffer_bytes();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(after_one[r], 0) << "rank " << r;
    EXPECT_EQ(after_three[r], after_one[r]) << "rank " << r << ": three layers kept more than one layer's buffers";
    EXPECT_GT(with_two_in_flight[r], after_one[r]) << "rank " << r << ": two steps in flight share nothing";
    EXPECT_LE(with_two_in_flight[r], 2 * after_one[r]) << "rank " << r;
  }
}

}  // namespace
}  // namespace epmoe::testing
