#include "run/whole_world_runner.h"

#include "core/error.h"
#include "core/threading.h"
#include "core/trace_recorder.h"
#include "run/run_faults.h"
#include "transport/threads/rank_threads.h"

namespace epmoe::run {

WholeWorldRunner::WholeWorldRunner(const ExpertParallelSettings& settings)
    : settings_(settings), ranks_(static_cast<std::size_t>(settings.num_ranks)) {
  EPMOE_CHECK(settings_.transport == TransportKind::threads, "the whole-world runner runs ranks as threads");
}

WholeWorldRunner::~WholeWorldRunner() = default;

void WholeWorldRunner::prepare_rank(LayerRank& rank, transport::Communicator* comm, const MoeLayerConfig& config) {
  if (built_for_ && *built_for_ == config && rank.layer != nullptr) return;
  build_layer_rank(rank, comm, settings_, config);
}

std::vector<RankReport> WholeWorldRunner::run(const LayerInputs& inputs, const MoeLayerConfig& config,
                                              const LayerOutputs& out) {
  const int num_ranks = settings_.num_ranks;
  std::vector<RankReport> reports(static_cast<std::size_t>(num_ranks));
  if (settings_.single_rank_local()) {
    set_compute_threads(settings_.compute_threads_per_rank);
    const RankFaultScope faults(settings_.faults, nullptr, settings_.ep.timeout);
    prepare_rank(ranks_[0], nullptr, config);
    built_for_ = config;
    reports[0] = run_layer_rank(ranks_[0], inputs, settings_, 0, rank_outputs(out, settings_, inputs.num_tokens, 0));
  } else {
    if (threads_ == nullptr) {
      threads_ = std::make_unique<transport::threads::RankThreads>(
          num_ranks, transport::threads::ThreadsOptions{.links = settings_.links,
                                                        .compute_threads_per_rank = settings_.compute_threads_per_rank,
                                                        .modelled = settings_.modelled,
                                                        .trace = settings_.trace});
    }
    if (threads_->needs_restart()) {
      // The last run failed and aborted its world: every rank's layer and
      // group go while their communicators still exist, then a fresh world
      // under the same threads, and the ranks are built anew on it.
      for (LayerRank& rank : ranks_) {
        rank.layer.reset();
        rank.group.reset();
      }
      built_for_.reset();
      threads_->restart();
    }
    try {
      // The ranks are built in a run of their own: their groups' agreement
      // all-gather is set-up, not the step. Each run starts modelled time
      // afresh (threads/rank_threads.h), and this one records no trace, so
      // the step's timeline starts at 0 on every rank and ends at the
      // reported step time, on the first call as on every later one.
      if (!built_for_ || !(*built_for_ == config)) {
        threads_->run([&](transport::Communicator& comm) {
          const UntracedScope set_up;
          const RankFaultScope faults(settings_.faults, &comm, settings_.ep.timeout);
          prepare_rank(ranks_[static_cast<std::size_t>(comm.rank())], &comm, config);
        });
        built_for_ = config;
      }
      threads_->run([&](transport::Communicator& comm) {
        const RankFaultScope faults(settings_.faults, &comm, settings_.ep.timeout);
        const int r = comm.rank();
        reports[static_cast<std::size_t>(r)] = run_layer_rank(ranks_[static_cast<std::size_t>(r)], inputs, settings_, r,
                                                              rank_outputs(out, settings_, inputs.num_tokens, r));
      });
    } catch (...) {
      built_for_.reset();  // whatever was built stays unused
      if (settings_.faults == nullptr) throw;
      settings_.faults->rethrow_naming_stopped_rank(std::current_exception());
    }
    built_for_ = config;
  }
  if (inputs.dy) {
    std::vector<const float*> parts;
    for (const LayerRank& rank : ranks_) parts.push_back(rank.dgate_part.data<float>());
    sum_in_rank_order(parts, out.dgate.numel(), out.dgate.data<float>());
  }
  return reports;
}

}  // namespace epmoe::run
