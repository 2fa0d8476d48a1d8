#include "run/expert_parallel_run.h"

#include <string>
#include <utility>

#include "comm/all_gather_texts.h"
#include "comm/tag.h"
#include "core/error.h"
#include "core/threading.h"
#include "run/layer_rank.h"
#include "run/rank_launcher.h"
#include "run/whole_world_runner.h"

namespace epmoe::run {

LayerOutputTensors LayerOutputTensors::allocate(const LayerInputs& in, int top_k) {
  const std::int64_t n = in.num_tokens, h = in.hidden, e = in.num_experts, f = in.ffn, k = top_k;
  LayerOutputTensors out{Tensor(DType::f32, {n, h}), Tensor(DType::i32, {n, k}), Tensor(DType::f32, {n, k}), {}};
  if (in.dy) {
    out.gradients = MoeGradients{Tensor(DType::f32, {n, h}), Tensor(DType::f32, {h, e}), Tensor(DType::f32, {e, h, f}),
                                 Tensor(DType::f32, {e, h, f}), Tensor(DType::f32, {e, f, h})};
  }
  return out;
}

LayerOutputs LayerOutputTensors::views() {
  LayerOutputs views{.y = y, .topk_ids = topk_ids, .topk_weights = topk_weights};
  if (gradients) {
    views.dx = gradients->dx;
    views.dgate = gradients->dgate;
    views.dwi0 = gradients->dwi0;
    views.dwi1 = gradients->dwi1;
    views.dwo = gradients->dwo;
  }
  return views;
}

namespace {

// The gather's tags (comm/tag.h) are above the layer's EP group's.
constexpr std::uint32_t kGatherTagBase = kLayerTagBase + kEpGroupTagRange;
enum class GatherTag : std::uint32_t { y, topk_ids, topk_weights, dx, dgate, dwi0, dwi1, dwo, report_texts };

// Rank 0 receives every other rank's rows of one output into `full` (its own
// are there already); the others send theirs. `rows_by_rank[r]` rows of
// `row_bytes` each, in rank order.
void gather_rows_to_rank_zero(transport::Communicator& comm, const MutableTensorView& local,
                              const MutableTensorView& full, const std::vector<std::int64_t>& rows_by_rank,
                              std::int64_t row_bytes, GatherTag which, std::chrono::milliseconds timeout) {
  const transport::Tag tag = comm::make_tag(comm::CollectiveKind::point_to_point,
                                            kGatherTagBase + static_cast<std::uint32_t>(which), comm::Slot::data);
  std::vector<std::unique_ptr<transport::Request>> requests;
  if (comm.rank() == 0) {
    std::int64_t first_row = rows_by_rank[0];
    for (int r = 1; r < comm.size(); ++r) {
      const std::int64_t bytes = rows_by_rank[r] * row_bytes;
      if (bytes > 0)
        requests.push_back(comm.irecv(r, tag, static_cast<char*>(full.raw()) + first_row * row_bytes, bytes));
      first_row += rows_by_rank[r];
    }
  } else if (rows_by_rank[comm.rank()] > 0) {
    requests.push_back(comm.isend(0, tag, local.raw(), rows_by_rank[comm.rank()] * row_bytes));
  }
  for (const auto& request : requests) request->wait(timeout);
}

// One process of an mpirun job: its rank's step into its own rows' buffers
// (rank 0's are the full outputs' rows), then rank 0 collects the rest.
std::optional<LayerRunResult> run_as_mpi_rank(transport::Communicator& comm, const LayerInputs& inputs,
                                              const MoeLayerConfig& config, const ExpertParallelSettings& settings) {
  const int r = comm.rank(), num_ranks = comm.size();
  EPMOE_CHECK_EQ(num_ranks, settings.num_ranks);
  std::vector<std::int64_t> token_rows, expert_rows;
  for (int q = 0; q < num_ranks; ++q) {
    token_rows.push_back(settings.first_token(q + 1, inputs.num_tokens) - settings.first_token(q, inputs.num_tokens));
    expert_rows.push_back(settings.num_local_experts());
  }
  // Rank 0 holds the full outputs and computes into its rows of them; the
  // others, buffers of their rows' shapes (a one-rank "world" of their rows).
  LayerOutputTensors full, mine;
  LayerOutputs rank_out;
  const int top_k = config.router.top_k;
  if (r == 0) {
    full = LayerOutputTensors::allocate(inputs, top_k);
    rank_out = rank_outputs(full.views(), settings, inputs.num_tokens, 0);
  } else {
    LayerInputs shape = inputs;
    shape.num_tokens = token_rows[r];
    shape.num_experts = settings.num_local_experts();
    mine = LayerOutputTensors::allocate(shape, top_k);
    rank_out = mine.views();
    rank_out.dgate = {};
  }
  LayerRank rank;
  build_layer_rank(rank, &comm, settings, config);
  const RankReport report = run_layer_rank(rank, inputs, settings, r, rank_out);

  const std::chrono::milliseconds timeout = settings.ep.timeout;
  const LayerOutputs full_views = r == 0 ? full.views() : LayerOutputs{};
  const std::int64_t h = inputs.hidden, f = inputs.ffn;
  gather_rows_to_rank_zero(comm, rank_out.y, full_views.y, token_rows, h * 4, GatherTag::y, timeout);
  gather_rows_to_rank_zero(comm, rank_out.topk_ids, full_views.topk_ids, token_rows, top_k * 4, GatherTag::topk_ids,
                           timeout);
  gather_rows_to_rank_zero(comm, rank_out.topk_weights, full_views.topk_weights, token_rows, top_k * 4,
                           GatherTag::topk_weights, timeout);
  if (inputs.dy) {
    gather_rows_to_rank_zero(comm, rank_out.dx, full_views.dx, token_rows, h * 4, GatherTag::dx, timeout);
    gather_rows_to_rank_zero(comm, rank_out.dwi0, full_views.dwi0, expert_rows, h * f * 4, GatherTag::dwi0, timeout);
    gather_rows_to_rank_zero(comm, rank_out.dwi1, full_views.dwi1, expert_rows, h * f * 4, GatherTag::dwi1, timeout);
    gather_rows_to_rank_zero(comm, rank_out.dwo, full_views.dwo, expert_rows, f * h * 4, GatherTag::dwo, timeout);
    // Every rank's dgate part to rank 0, summed there in rank order.
    const std::int64_t dgate_elements = rank.dgate_part.numel();
    Tensor parts(DType::f32, {r == 0 ? std::int64_t{num_ranks} : 1, dgate_elements});
    if (r == 0) std::copy_n(rank.dgate_part.data<float>(), dgate_elements, parts.data<float>());
    MutableTensorView all_parts = parts.mutable_view();
    gather_rows_to_rank_zero(comm, rank.dgate_part.mutable_view(), all_parts,
                             std::vector<std::int64_t>(static_cast<std::size_t>(num_ranks), 1), dgate_elements * 4,
                             GatherTag::dgate, timeout);
    if (r == 0) {
      std::vector<const float*> part_pointers;
      for (int q = 0; q < num_ranks; ++q) part_pointers.push_back(parts.data<float>() + q * dgate_elements);
      sum_in_rank_order(part_pointers, dgate_elements, full.gradients->dgate.data<float>());
    }
  }
  std::vector<RankReport> reports;
  const std::uint32_t report_tag = kGatherTagBase + static_cast<std::uint32_t>(GatherTag::report_texts);
  for (const std::string& text : comm::all_gather_texts(comm, nlohmann::json(report).dump(), report_tag, timeout))
    reports.push_back(nlohmann::json::parse(text).get<RankReport>());
  if (r != 0) return std::nullopt;
  return LayerRunResult{std::move(full), std::move(reports)};
}

}  // namespace

std::optional<LayerRunResult> run_layer_across_ranks(const LayerInputs& inputs, const MoeLayerConfig& config,
                                                     const ExpertParallelSettings& settings) {
  if (settings.transport == TransportKind::threads) {
    LayerRunResult result{LayerOutputTensors::allocate(inputs, config.router.top_k), {}};
    WholeWorldRunner runner(settings);
    result.ranks = runner.run(inputs, config, result.outputs.views());
    return result;
  }
  std::optional<LayerRunResult> result;
  launch_ranks(settings, [&](transport::Communicator& comm) {
    std::optional<LayerRunResult> own = run_as_mpi_rank(comm, inputs, config, settings);
    if (own) result = std::move(own);
  });
  return result;
}

}  // namespace epmoe::run
