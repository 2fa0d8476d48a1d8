// The typed dispatch handle (ep/dispatch_handle.h) and the split-phase layer
// under expert parallelism. Ranks are threads (R in {1, 2, 3, 4}), one
// compute thread each; every dispatcher.
//  * split-phase calls with other work in flight between each begin and its
//    finish give the same bits as forward()/backward();
//  * the handle refuses calls out of order, naming the call and the next
//    allowed one; a dispatcher holds many steps in flight, up to its limit.
// Transport: threads (run_ep_layer).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/error.h"
#include "ep/local_dispatcher.h"
#include "ep_harness.h"
#include "expect_reference.h"

namespace epmoe::testing {
namespace {

struct SplitCase {
  const char* name;
  DispatchKind dispatch;
  int chunks;
  bool dedup;
  RematPolicy remat;
  int redundant_slots;
};

TEST(SplitPhaseEp, InterleavedWorkGivesTheSameBitsForEveryDispatcher) {
  const RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 12, .top_k = 3};
  const MoeProblem p = make_problem(45, 16, 12, router, 21);
  const SplitCase cases[] = {
      {"alltoall", DispatchKind::alltoall, 1, false, {}, 0},
      {"alltoall dedup chunks=3 remat", DispatchKind::alltoall, 3, true, RematPolicy::preset("remat_policy", "full"),
       0},
      {"alltoall replicas", DispatchKind::alltoall, 2, false, {}, 2},
      {"ring chunks=2", DispatchKind::ring, 2, false, {}, 0},
      {"ring remat replicas", DispatchKind::ring, 1, false, RematPolicy::preset("remat_policy", "full"), 1},
  };
  for (const int num_ranks : {1, 2, 3, 4}) {
    for (const SplitCase& c : cases) {
      if (c.redundant_slots > 0 && num_ranks == 1) continue;  // replicas need another rank's experts
      EpRunOptions options{.num_ranks = num_ranks, .dispatch = c.dispatch, .remat = c.remat};
      options.ep.num_chunks = c.chunks;
      options.ep.dedup = c.dedup;
      if (c.redundant_slots > 0) {
        options.ep.balance = BalanceMode::dynamic;
        options.ep.redundant_slots = c.redundant_slots;
      }
      const EpRunResult whole = run_ep_layer(p, options);
      options.split_phase_with_other_work = true;
      const EpRunResult split = run_ep_layer(p, options);
      SCOPED_TRACE(std::string(c.name) + " R=" + std::to_string(num_ranks));
      expect_same_bits(whole, split, "split phase");
    }
  }
}

void expect_usage_error(const std::function<void()>& call, const std::string& expected) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected: " << expected;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST(DispatchHandle, RefusesCallsOutOfOrderNamingTheNextOne) {
  const RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 2};
  const MoeProblem p = make_problem(6, 8, 8, router, 2);
  ep::LocalDispatcher dispatcher({.num_experts = 4, .top_k = 2, .hidden = 8, .num_chunks = 2});
  std::vector<std::int32_t> ids(12);
  std::vector<float> weights(12, 0.5f);
  for (int i = 0; i < 12; ++i) ids[i] = i % 4;
  const ep::RoutingView routing{ids.data(), weights.data(), 6, 2};
  Tensor y(DType::f32, {6, 8}), dx(DType::f32, {6, 8}), dweights(DType::f32, {6, 2});

  ep::DispatchHandle empty;
  expect_usage_error([&] { empty.rows(0); }, "rows(chunk 0) on a handle not in a step");

  ep::DispatchHandle handle = dispatcher.start_step(2);
  expect_usage_error([&] { handle.rows(0); }, "rows(chunk 0) out of order: the next call must be dispatch()");
  handle.dispatch(p.x, routing);
  expect_usage_error([&] { handle.dispatch(p.x, routing); }, "dispatch() out of order");
  expect_usage_error([&] { handle.rows(1); }, "rows(chunk 1) out of order: the next call must be rows(chunk 0)");
  expect_usage_error([&] { handle.combine(0, Tensor()); }, "the next call must be rows(chunk 0)");
  expect_usage_error([&] { handle.finish_forward(y); }, "finish_forward() out of order");
  const ep::ExpertRows rows0 = handle.rows(0);
  expect_usage_error([&] { handle.rows(1); }, "the next call must be combine(chunk 0)");
  handle.combine(0, Tensor::zeros(DType::f32, {3, 8}));
  const ep::ExpertRows rows1 = handle.rows(1);
  handle.combine(1, Tensor::zeros(DType::f32, {3, 8}));
  expect_usage_error([&] { handle.cotangents(0); }, "the next call must be finish_forward()");
  handle.finish_forward(y);
  expect_usage_error([&] { handle.finish_forward(y); }, "the next call must be start_backward()");
  handle.start_backward(p.dy);
  expect_usage_error([&] { handle.return_gradients(0, Tensor(), {}); },
                     "the next call must be cotangents (or redispatch_rows)(chunk 0)");
  handle.redispatch_rows(0);
  expect_usage_error([&] { handle.redispatch_rows(0); }, "called twice");
  handle.cotangents(0);
  handle.return_gradients(0, Tensor::zeros(DType::f32, {3, 8}), std::vector<float>(rows0.num_rows(), 0.0f));
  handle.cotangents(1);
  expect_usage_error([&] { handle.finish_backward(dx, dweights); }, "the next call must be return_gradients(chunk 1)");
  handle.return_gradients(1, Tensor::zeros(DType::f32, {3, 8}), std::vector<float>(rows1.num_rows(), 0.0f));
  handle.finish_backward(dx, dweights);
  expect_usage_error([&] { handle.finish_backward(dx, dweights); }, "not in a step");
  EXPECT_EQ(dispatcher.steps_in_flight(), 0);
}

// Steps own their state: any number (up to the group's limit) may be in
// flight at once, each abandoned one frees its tag block and layout, and one
// too many is refused naming the limit.
TEST(DispatchHandle, ManyStepsInFlightAndTheLimit) {
  const RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 4, .top_k = 2};
  const MoeProblem p = make_problem(6, 8, 8, router, 2);
  ep::LocalDispatcher dispatcher({.num_experts = 4, .top_k = 2, .hidden = 8});
  std::vector<std::int32_t> ids(12);
  std::vector<float> weights(12, 0.5f);
  for (int i = 0; i < 12; ++i) ids[i] = i % 4;
  const ep::RoutingView routing{ids.data(), weights.data(), 6, 2};
  std::vector<ep::DispatchHandle> steps;
  std::set<std::uint32_t> tag_bases;
  for (int i = 0; i < kEpGroupMaxStepsInFlight; ++i) {
    steps.push_back(dispatcher.start_step(1));
    steps.back().dispatch(p.x, routing);
    tag_bases.insert(steps.back().tag_base());
  }
  EXPECT_EQ(static_cast<int>(tag_bases.size()), kEpGroupMaxStepsInFlight) << "every step in flight has its own tags";
  EXPECT_EQ(dispatcher.steps_in_flight(), kEpGroupMaxStepsInFlight);
  expect_usage_error([&] { dispatcher.start_step(1); }, "more than 64 steps in flight");
  steps.front() = ep::DispatchHandle();  // abandoned mid-step: its block is free again
  ep::DispatchHandle next = dispatcher.start_step(1);
  EXPECT_TRUE(next.in_step());
  steps.clear();
  next = ep::DispatchHandle();
  EXPECT_EQ(dispatcher.steps_in_flight(), 0);
}

}  // namespace
}  // namespace epmoe::testing
