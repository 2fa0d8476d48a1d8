// A rank that fails inside a dispatcher fails every rank at once.
// Topology: R in {3, 4} ranks as threads, N = 6R tokens (6 per rank),
// E = 2R experts, top_k = 3, 2 token chunks, the collective timeout at its
// 60 s default. Rank 1 throws at fault_point("dispatch") - between posting
// chunk 0's token exchange and waiting for it - on its own thread, while the
// exchange is in flight. The whole run must end within 2 s (no rank waits
// for a deadline) and rethrow rank 1's InjectedFault, not an abort-induced
// error of another rank; the same for a fault inside a collective's
// algorithm (fault_point "collective").
// Transport: threads (run_ep_layer), one compute thread per rank.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "core/fault_injection.h"
#include "ep_harness.h"

namespace epmoe {
namespace {

class DispatchFault : public ::testing::TestWithParam<std::tuple<int, DispatchKind, const char*>> {};

TEST_P(DispatchFault, EveryRankStopsAtOnceWithTheFirstError) {
  const auto [num_ranks, dispatch, point] = GetParam();
  RouterConfig router{.kind = RouterKind::softmax_topk, .num_experts = 2 * num_ranks, .top_k = 3};
  const testing::MoeProblem p = testing::make_problem(6 * num_ranks, 12, 10, router, 300 + num_ranks, 0.2);
  testing::EpRunOptions options{.num_ranks = num_ranks, .dispatch = dispatch};
  options.ep.num_chunks = 2;
  const std::string spec = std::string("1:") + point;
  FaultInjector faults(spec);
  options.faults = &faults;
  const auto start = std::chrono::steady_clock::now();
  try {
    testing::run_ep_layer(p, options);
    ADD_FAILURE() << "no failure";
  } catch (const InjectedFault& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1: injected fault at " + std::string(point) +
                                         " (fault_injection=" + spec + ")"),
              std::string::npos)
        << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the root cause was masked by: " << e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 2.0) << "a rank waited for its deadline";
}

INSTANTIATE_TEST_SUITE_P(Sweep, DispatchFault,
                         ::testing::Combine(::testing::Values(3, 4),
                                            ::testing::Values(DispatchKind::alltoall, DispatchKind::ring),
                                            ::testing::Values("dispatch", "collective")),
                         [](const auto& info) {
                           return "R" + std::to_string(std::get<0>(info.param)) + "_" +
                                  to_string(std::get<1>(info.param)) + "_" + std::get<2>(info.param);
                         });

}  // namespace
}  // namespace epmoe
