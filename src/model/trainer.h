// The training loop of the tiny MoE LM (DESIGN.md §4.9), run by every rank
// (a rank thread, or an MPI process) on its own communicator:
//
//   per step: this rank's sequences of the global batch (data/synthetic_tokens.h)
//     -> forward (MoE layers dispatch across ranks)
//     -> all-gather of expert counts and loss sums (load-balance loss, metrics;
//        under the backward when there is no load-balance loss)
//     -> backward, the replicated gradients' sum over ranks started bucket
//        by bucket as layers finish them (model/gradient_reduction.h)
//     -> global gradient norm (replicated + every rank's experts), clipping
//     -> AdamW with warm-up + cosine learning rate
//     -> aux-loss-free selection-bias update (sigmoid_grouped)
//     -> a record for metrics and the progress line (every rank's report
//        gathered under the next step's forward, unless a checkpoint follows
//        or it is the last step); a checkpoint every n steps
//
// Reproducibility: batches, initial weights and random routing are functions
// of (seed, step, sequence / expert / layer), never of a generator's history,
// and every sum across ranks has a fixed order, so a resumed run repeats an
// uninterrupted one bit for bit and threads and MPI give the same bits.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/synthetic_tokens.h"
#include "model/adamw.h"
#include "model/lr_schedule.h"
#include "model/moe_lm.h"
#include "model/step_metrics.h"
#include "transport/communicator.h"

namespace epmoe {

struct TrainerConfig {
  std::int64_t steps = 300;
  std::int64_t batch_size = 32;  // sequences per step, over all ranks; divisible by R
  SyntheticTokensConfig data;    // vocab_size, seq_len, distribution, exponent, seed
  AdamWConfig adamw;
  LrSchedule learning_rate;       // its total_steps is `steps`
  double grad_clip = 1.0;         // global L2 norm; 0 = off
  double aux_loss_coef = 0.0;     // load-balance loss; 0 = off
  double bias_update_rate = 0.0;  // aux-loss-free bias step (sigmoid_grouped); 0 = off

  std::string checkpoint_dir;         // empty: no checkpoints
  std::int64_t checkpoint_every = 0;  // steps; 0 = only at the end
  int checkpoint_keep = 3;            // newest checkpoints kept
  bool resume = false;
  nlohmann::json checkpoint_metadata;  // written into every manifest; holds "compatibility"

  // The replicated gradients' sum over ranks starts bucket by bucket during
  // the backward (model/gradient_reduction.h) instead of as one all-reduce
  // after it; the same bits either way.
  bool overlap_gradient_all_reduce = true;

  std::chrono::milliseconds comm_timeout{60000};
  std::uint32_t tag_base = 0;  // the trainer's collective tags: [tag_base, tag_base + 1024)

  // ConfigError naming the key.
  void validate(int num_ranks) const;
};

struct TrainSummary {
  std::int64_t steps_run = 0;
  std::vector<double> losses;      // one per step run
  std::int64_t dropped_pairs = 0;  // over the steps run, all ranks and layers
  std::int64_t routed_pairs = 0;   // the (token, expert) pairs of those steps
  double seconds = 0;
  std::optional<std::int64_t> resumed_from;
  std::optional<std::int64_t> last_checkpoint;
};

// Rank 0 only: told about each step and each checkpoint as they finish.
struct TrainObserver {
  std::function<void(std::int64_t first_step, std::optional<std::int64_t> resumed_from)> on_start;
  // Before the first step, once per thing the run did differently from what
  // it was asked (an elastic resume, a reset replica plan).
  std::function<void(const std::string&)> on_note;
  // Step N's record, before checkpoint N (if any) is written; in step order,
  // called during step N + 1 (after its forward) unless checkpoint N follows
  // or N is the last step. An error it throws names step N.
  std::function<void(const StepRecord&)> on_step;
};

// Runs the loop on this rank; collective over `comm`. `observer` is called on
// rank 0 only. Returns this rank's summary (the losses are global, the same
// on every rank).
// `group`: this rank's EP group over `comm` (or a single-rank group), which
// every MoE layer of the model runs on; its tag range must not meet
// [config.tag_base, config.tag_base + 1024).
TrainSummary train(transport::Communicator& comm, EpGroup& group, const TrainerConfig& config, const MoeLmConfig& model,
                   const TrainObserver& observer = {});

}  // namespace epmoe

namespace epmoe {

// The step a run starts from: nullopt for a fresh start, or the newest
// committed checkpoint's step with resume=true (its manifest verified and its
// compatibility checked). Throws ConfigError when checkpoints exist and
// resume=false (they are never overwritten), FileError for an unreadable
// manifest or a step_N/ without a manifest newer than the resume point. Read-only: the CLI calls it before any work
// starts.
std::optional<std::int64_t> checkpoint_to_resume(const TrainerConfig& config);

}  // namespace epmoe
