// The expert-parallel layer with ranks as MPI processes (mpirun -np R):
// every rank builds the same seeded problem, runs its slice (tokens
// [r·N/R, (r+1)·N/R), experts [r·E/R, (r+1)·E/R)) over the mpi transport,
// and checks its part of y, dx and dW against the double reference; dgate is
// summed over ranks with all_reduce first. Variants: alltoall, alltoall
// dedup, ring with 2 chunks, ring with fp8 tokens skipped (threads tests
// cover it), and dynamic replicas (balance=dynamic, rebalance_threshold=1 so
// the planner places replicas where it can) on both dispatchers: replica
// weights and gradients travel point to point over MPI. Exit status 0 only if every check on every rank passed.
// Topology: mpirun -np R with R in {2, 3, 4} (tests/ep/CMakeLists.txt), mpi
// transport, the OpenMP default of compute threads per process.
#include <cstdio>
#include <string>

#include <epmoe/moe_layer.h>
#include "comm/all_reduce.h"
#include "ep/ep_config.h"
#include "ep_harness.h"
#include "transport/mpi/launcher.h"

namespace epmoe {
namespace {

double part_error(const Tensor& got, const std::vector<double>& ref, std::int64_t offset) {
  double max_diff = 0, max_ref = 0;
  for (double v : ref) max_ref = std::max(max_ref, std::abs(v));
  for (std::int64_t i = 0; i < got.numel(); ++i)
    max_diff = std::max(max_diff, std::abs(double(got.data<float>()[i]) - ref[offset + i]));
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

int run_checks(transport::Communicator& comm) {
  const int num_ranks = comm.size(), r = comm.rank();
  RouterConfig router{.kind = RouterKind::sigmoid_grouped,
                      .num_experts = 2 * num_ranks,
                      .top_k = 3,
                      .n_groups = 2,
                      .topk_groups = 2,
                      .routed_scaling_factor = 2.5f};
  const testing::MoeProblem p = testing::make_problem(5 * num_ranks, 12, 10, router, 41, 0.2);
  const testing::ReferenceResult ref = testing::reference_moe(p);
  const std::int64_t n = p.num_tokens, h = p.hidden, f = p.ffn;
  const std::int64_t t0 = n * r / num_ranks, t1 = n * (r + 1) / num_ranks;
  const std::int64_t el = router.num_experts / num_ranks, e0 = r * el;
  const Tensor x = testing::slice_rows(p.x, t0, t1), dy = testing::slice_rows(p.dy, t0, t1);
  const Tensor wi0 = testing::slice_rows(p.wi0, e0, e0 + el), wi1 = testing::slice_rows(p.wi1, e0, e0 + el),
               wo = testing::slice_rows(p.wo, e0, e0 + el);
  struct Variant {
    const char* name;
    DispatchKind dispatch;
    bool dedup;
    int chunks;
    int redundant_slots = 0;
  };
  int failures = 0, checks = 0;
  std::uint32_t tag_base = 0;
  for (const Variant v : {Variant{"alltoall", DispatchKind::alltoall, false, 1},
                          Variant{"alltoall dedup", DispatchKind::alltoall, true, 2},
                          Variant{"ring chunks=2", DispatchKind::ring, false, 2},
                          Variant{"alltoall replicas B=2", DispatchKind::alltoall, false, 2, 2},
                          Variant{"ring replicas B=1", DispatchKind::ring, false, 2, 1}}) {
    EpConfig config{.num_experts = router.num_experts,
                    .top_k = router.top_k,
                    .hidden = h,
                    .num_chunks = v.chunks,
                    .dedup = v.dedup,
                    .tag_base = tag_base};
    if (v.redundant_slots > 0) {
      config.balance = BalanceMode::dynamic;
      config.redundant_slots = v.redundant_slots;
      config.rebalance_threshold = 1.0;
    }
    tag_base += 1024;
    EpConfig group_config = config;
    group_config.dispatch = v.dispatch;
    EpGroup group(comm, group_config);
    MoeLayer layer({.hidden = h, .ffn = f, .router = router}, group);
    const MoeForwardOutput out = layer.forward(x, {p.gate, wi0, wi1, wo, p.bias});
    MoeGradients grads = layer.backward(dy);
    comm::all_reduce(comm, {.data = grads.dgate.raw(), .num_elements = grads.dgate.numel(), .tag = tag_base + 1000})
        .wait();
    const std::pair<const char*, double> errors[] = {{"y", part_error(out.y, ref.y, t0 * h)},
                                                     {"dx", part_error(grads.dx, ref.dx, t0 * h)},
                                                     {"dgate", part_error(grads.dgate, ref.dgate, 0)},
                                                     {"dwi0", part_error(grads.dwi0, ref.dwi0, e0 * h * f)},
                                                     {"dwi1", part_error(grads.dwi1, ref.dwi1, e0 * h * f)},
                                                     {"dwo", part_error(grads.dwo, ref.dwo, e0 * f * h)}};
    for (const auto& [name, error] : errors) {
      ++checks;
      if (!(error <= 1e-5)) {
        ++failures;
        std::fprintf(stderr, "rank %d %s: %s relative error %g > 1e-5\n", r, v.name, name, error);
      }
    }
  }
  float failed = static_cast<float>(failures);
  comm::all_reduce(comm, {.data = &failed, .num_elements = 1, .tag = tag_base + 1001}).wait();
  if (r == 0) std::printf("%d passed, %d failed\n", checks * num_ranks - int(failed), int(failed));
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace epmoe

int main(int argc, char** argv) {
  int status = 1;
  const int launcher_status = epmoe::transport::mpi::run_rank(
      argc, argv, [&](epmoe::transport::Communicator& comm) { status = epmoe::run_checks(comm); });
  return launcher_status != 0 ? launcher_status : status;
}
