#include "ep_harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>

#include "comm/all_reduce.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/threading.h"
#include "transport/threads/communicator.h"
#include "transport/threads/launcher.h"

namespace epmoe::testing {

Tensor slice_rows(const Tensor& t, std::int64_t begin, std::int64_t end) {
  Shape shape = t.shape();
  const std::int64_t row_elements = t.numel() / std::max<std::int64_t>(1, shape[0]);
  shape[0] = end - begin;
  Tensor out(t.dtype(), shape);
  const std::size_t row_bytes = static_cast<std::size_t>(row_elements) * dtype_size_bytes(t.dtype());
  if (out.size_bytes() > 0)
    std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + begin * row_bytes, (end - begin) * row_bytes);
  return out;
}

namespace {

void copy_rows_into(Tensor& dst, std::int64_t begin, const Tensor& src) {
  const std::size_t row_bytes =
      static_cast<std::size_t>(dst.numel() / std::max<std::int64_t>(1, dst.dim(0))) * dtype_size_bytes(dst.dtype());
  if (src.size_bytes() > 0)
    std::memcpy(static_cast<char*>(dst.raw()) + begin * row_bytes, src.raw(),
                static_cast<std::size_t>(src.size_bytes()));
}

}  // namespace

namespace {

// What a caller does between a begin and its finish: an all-reduce in
// flight across the layer's own exchanges (its own tags), and compute.
void other_work(transport::Communicator& comm, std::uint32_t round) {
  std::vector<float> data(1000, static_cast<float>(comm.rank() + 1));
  comm::CollectiveHandle reduce =
      comm::all_reduce(comm, {.data = data.data(), .num_elements = 1000, .tag = 0x7000 + round});
  double sink = 0;
  for (int i = 0; i < 20000; ++i) sink += std::sqrt(double(i));
  reduce.wait();
  EPMOE_CHECK(sink > 0);
  const float expected = static_cast<float>(comm.size() * (comm.size() + 1) / 2);
  for (const float v : data) EPMOE_CHECK_EQ(v, expected);
}

}  // namespace

Picoseconds EpRunResult::modelled_step(std::size_t step) const {
  const std::vector<Picoseconds>& start = step_modelled_start.at(step);
  const std::vector<Picoseconds>& end = step_modelled_end.at(step);
  return *std::max_element(end.begin(), end.end()) - *std::min_element(start.begin(), start.end());
}

EpRunResult run_ep_layer(const MoeProblem& p, const EpRunOptions& options) {
  const int num_ranks = options.num_ranks;
  const std::int64_t n = p.num_tokens, h = p.hidden, f = p.ffn;
  const int e = p.router.num_experts, k = p.router.top_k;
  EpRunResult result{Tensor(DType::f32, {n, h}),
                     Tensor(DType::i32, {n, k}),
                     Tensor(DType::f32, {n, k}),
                     {Tensor(DType::f32, {n, h}), Tensor::zeros(DType::f32, {h, e}), Tensor(DType::f32, {e, h, f}),
                      Tensor(DType::f32, {e, h, f}), Tensor(DType::f32, {e, f, h})},
                     std::vector<ep::DispatchStats>(static_cast<std::size_t>(num_ranks)),
                     std::vector<RankMemory>(static_cast<std::size_t>(num_ranks)),
                     {}};
  std::vector<Tensor> dgates(static_cast<std::size_t>(num_ranks));
  result.step_stats.assign(std::max<std::size_t>(1, options.weight_versions.size()),
                           std::vector<ep::DispatchStats>(static_cast<std::size_t>(num_ranks)));
  result.replica_stats.resize(static_cast<std::size_t>(num_ranks));
  result.step_replica_stats.assign(result.step_stats.size(),
                                   std::vector<ep::ReplicaStats>(static_cast<std::size_t>(num_ranks)));
  result.transport_sent.resize(static_cast<std::size_t>(num_ranks));
  result.step_transport_sent.assign(result.step_stats.size(),
                                    std::vector<transport::SentBytes>(static_cast<std::size_t>(num_ranks)));
  result.step_transport_sent_by_tag.assign(
      result.step_stats.size(),
      std::vector<std::map<transport::Tag, std::int64_t>>(static_cast<std::size_t>(num_ranks)));
  result.step_modelled_start.assign(result.step_stats.size(), std::vector<Picoseconds>(num_ranks, 0));
  result.step_modelled_end = result.step_modelled_start;
  EpConfig config = options.ep;
  config.num_experts = e;
  config.top_k = k;
  config.hidden = h;
  config.dispatch = options.dispatch;

  transport::threads::ThreadsOptions threads_options;
  threads_options.compute_threads_per_rank = options.compute_threads_per_rank;
  threads_options.modelled = options.modelled;
  if (options.modelled.enabled) threads_options.links = options.links;
  transport::threads::run_ranks(num_ranks, threads_options, [&](transport::Communicator& comm) {
    const FaultScope faults(options.faults);
    const int r = comm.rank();
    const auto& threads_comm = dynamic_cast<const transport::threads::ThreadsCommunicator&>(comm);
    EPMOE_CHECK_EQ(compute_threads(), options.compute_threads_per_rank, "the rank thread's OpenMP budget");
    std::int64_t t0 = n * r / num_ranks, t1 = n * (r + 1) / num_ranks;
    if (!options.tokens_by_rank.empty()) {
      t0 = 0;
      for (int q = 0; q < r; ++q) t0 += options.tokens_by_rank[q];
      t1 = t0 + options.tokens_by_rank[r];
    }
    const std::int64_t el = e / num_ranks, e0 = r * el;
    // Views of the problem's rows, as a caller's shards would be: no copies.
    const TensorView x = p.x.view().rows(t0, t1), dy = p.dy.view().rows(t0, t1);
    const TensorView wi0 = p.wi0.view().rows(e0, e0 + el), wi1 = p.wi1.view().rows(e0, e0 + el),
                     wo = p.wo.view().rows(e0, e0 + el);
    MemoryLedger ledger;
    EPMOE_CHECK(!options.local_dispatcher || num_ranks == 1, "a LocalDispatcher holds every expert: R = 1 only");
    EpGroup group = options.local_dispatcher ? EpGroup(config, &ledger) : EpGroup(comm, config, &ledger);
    MoeLayer layer(
        {.hidden = h, .ffn = f, .router = p.router, .compute_dtype = options.compute_dtype, .remat = options.remat},
        group, &ledger);
    const std::size_t num_steps = std::max<std::size_t>(1, options.weight_versions.size());
    MoeForwardOutput out;
    MoeGradients grads;
    for (std::size_t step = 0; step < num_steps; ++step) {
      std::optional<std::uint64_t> version;
      if (!options.weight_versions.empty()) version = options.weight_versions[step];
      const transport::SentBytes sent_before = comm.sent_bytes().value();
      const std::map<transport::Tag, std::int64_t> by_tag_before = threads_comm.sent_bytes_by_tag();
      const ModelledClock* clock = this_thread_modelled_clock();
      if (clock != nullptr) result.step_modelled_start[step][r] = clock->now();
      if (!options.split_phase_with_other_work) {
        out = layer.forward(x, {p.gate, wi0, wi1, wo, p.bias}, {.weight_version = version});
        grads = layer.backward(dy);
      } else {
        MoeStep moe_step = layer.begin_forward(x, {p.gate, wi0, wi1, wo, p.bias}, {.weight_version = version});
        other_work(comm, 1);
        out = layer.finish_forward(moe_step);
        layer.begin_backward(moe_step, dy);
        other_work(comm, 2);
        grads = layer.finish_backward(moe_step);
      }
      if (clock != nullptr) result.step_modelled_end[step][r] = clock->now();
      result.step_stats[step][r] = layer.last_step_stats().dispatch;
      result.step_replica_stats[step][r] = layer.last_step_stats().replicas;
      transport::SentBytes sent = comm.sent_bytes().value();
      for (int q = 0; q < num_ranks; ++q) sent.to_peer[q] -= sent_before.to_peer[q];
      sent.total -= sent_before.total;
      result.step_transport_sent[step][r] = sent;
      std::map<transport::Tag, std::int64_t> by_tag = threads_comm.sent_bytes_by_tag();
      for (const auto& [tag, bytes] : by_tag_before) by_tag[tag] -= bytes;
      std::erase_if(by_tag, [](const auto& entry) { return entry.second == 0; });
      result.step_transport_sent_by_tag[step][r] = std::move(by_tag);
    }
    result.transport_sent[r] = result.step_transport_sent[num_steps - 1][r];
    copy_rows_into(result.y, t0, out.y);
    copy_rows_into(result.topk_ids, t0, out.topk_ids);
    copy_rows_into(result.topk_weights, t0, out.topk_weights);
    copy_rows_into(result.grads.dx, t0, grads.dx);
    copy_rows_into(result.grads.dwi0, e0, grads.dwi0);
    copy_rows_into(result.grads.dwi1, e0, grads.dwi1);
    copy_rows_into(result.grads.dwo, e0, grads.dwo);
    dgates[r] = std::move(grads.dgate);
    result.stats[r] = layer.last_step_stats().dispatch;
    result.replica_stats[r] = layer.last_step_stats().replicas;
    const LedgerSnapshot snapshot = ledger.snapshot();
    for (const auto& [name, entry] : snapshot.by_name) {
      result.memory[r].peak_bytes_by_name[name] = entry.peak_bytes;
      result.memory[r].live_bytes_by_name[name] = entry.live_bytes;
    }
    result.memory[r].saved_peak_bytes = ledger.group_peak_bytes("saved");
    result.memory[r].total_peak_bytes = snapshot.total_peak_bytes;
    result.memory[r].recomputed_bytes = layer.stats().recomputed_bytes;
  });
  // The gate is replicated: its gradient is the sum of every rank's part.
  for (const Tensor& part : dgates)
    for (std::int64_t i = 0; i < part.numel(); ++i) result.grads.dgate.data<float>()[i] += part.data<float>()[i];
  return result;
}

}  // namespace epmoe::testing
