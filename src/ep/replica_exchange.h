// ReplicaExchange: dynamic redundant experts inside one MoE layer
// (DESIGN.md §4.8). Owned and driven by the layer (moe/moe_layer.cc), which
// maps the step's logical experts to physical destinations with it before
// the dispatch; the dispatchers see destinations only (ep/step_state.h). Its
// messages use the step's block of tags (DispatchHandle::tag_base).
//
// Per step:
//  1. plan_step: this rank's (token, k) pairs per expert over the whole step
//     (all chunks) are all-gathered as [R, E] i64 counts - one tiny
//     collective - and every rank runs balance::plan_replicas on the same
//     integers, so every rank holds the same plan. The previous step's slot
//     contents are passed in, so an expert that stays on a rank keeps its
//     slot (and its weights).
//  2. Rerouting (balance/replica_plan.h rule): from the plan and the counts,
//     every rank computes the same locality-first sub-quotas once per step
//     (balance::sub_quotas): how many of source rank s's pairs of expert e
//     each copy of e computes — a copy takes its own rank's pairs first, the
//     rest are matched sources ascending, copies in copy order. Within source
//     s, its pairs of e in (token, k) order over the step fill e's copies'
//     sub-quotas in copy order (the positional rule); destination() answers
//     that for any (source rank, expert, index) by a binary search in the
//     per-(source, copy) prefix sums, and every copy computes exactly its
//     quota. The all-to-all with dedup (and replica_choice=dedup, the
//     default) instead chooses, within the same per-(source, copy)
//     sub-quotas, copies on ranks that already receive the token
//     (balance/dedup_aware_choice.h). The ring keeps the positional rule: it
//     has no dedup, every token reaching every rank once anyway, so there is
//     nothing to save. Either way the sender decides (destinations()), for
//     its own pairs, and the choice travels with them.
//  3. start_slot_weights / finish_slot_weights (the layer: started as soon
//     as the plan is known, before the dispatch's tokens are encoded, and
//     finished before the experts compute): each slot whose (expert, weight
//     version) changed receives wi0/wi1/wo of its expert point-to-point
//     from the expert's home rank into this exchange's own slot buffers;
//     nothing moves when every slot is current. Every rank tracks every
//     slot's contents from the (identical) plans, so sender and receiver
//     agree without a handshake. The messages run as one collective,
//     "replica weights tag T" (comm/collective_handle.h): they move while
//     the rank encodes and dispatches its tokens (and the caller works until
//     finish_forward), and a trace shows them as one event. The experts then
//     compute on per-group pointers (compute_weights): the caller's home
//     weights as they are, the slots' from these buffers; nothing is copied.
//  4. start_slot_gradients / finish_slot_gradients (the layer: started once
//     the experts' backward has written every slot's dW, finished after the
//     dispatch's backward, so the gradients move while dx comes back): each
//     slot's dW (computed into this exchange's slot gradient buffers)
//     goes point-to-point to its expert's home rank ("replica gradients tag
//     T") and is added to the home expert's gradient there, slots in
//     ascending (rank, slot) order: deterministic, each replica's
//     contribution counted once. No collective over all experts' weights
//     anywhere.
//
// Cost-aware plans (balance=dynamic with EpConfig::replica_costs priced,
// docs/BALANCE.md "Cost model"): plan_step prices every candidate replica
// (balance::ReplicaCosts) from the rates, the expert shape, the weights'
// wire format and, for the all-to-all, the all-gathered per-source counts;
// a slot kept at an unchanged weight version costs no weights. When a
// priced plan places nothing, the next 1, 2, 4, ..., 16 steps skip the counts
// round and the plan (every pair goes home), so a layer whose replicas do
// not pay spends (almost) nothing on balancing; the next plan looks again.
// With EpConfig::replica_planning=forecast the caller decides the looks for
// free instead: forecast_from prices a plan on the counts of the step just
// run (gathered by the caller on a collective it runs anyway), and the next
// step looks only when that plan places replicas; otherwise it goes home
// without the counts round (a refusing layer costs the step nothing).
//
// Local expert indices on a rank: [0, E_l) home experts, E_l + b slot b.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <epmoe/config.h>
#include "balance/replica_plan.h"
#include "balance/replica_planner.h"
#include "comm/collective_handle.h"
#include "core/tensor.h"

#include "ep/expert_rows.h"
#include "ep/replica_stats.h"
#include "transport/communicator.h"

namespace epmoe::ep {

// Where one (token, k) pair is computed: a rank and its local expert index
// there (a home expert or E_l + slot).
struct PairDestination {
  int rank = 0;
  int local_expert = 0;
};

// This rank's home experts' weights: the caller's views, f32 and
// C-contiguous, sent from where they are (no copy).
struct HomeExpertWeights {
  TensorView wi0;  // [E_l, H, F]
  TensorView wi1;  // [E_l, H, F]
  TensorView wo;   // [E_l, F, H]
};
// Their gradients, the same shapes.
struct HomeExpertGradients {
  float* dwi0 = nullptr;
  float* dwi1 = nullptr;
  float* dwo = nullptr;
};

// What the cost model needs of the experts beyond EpConfig.
struct ReplicaExpertShape {
  std::int64_t ffn = 0;  // F; 0: unknown, replicas unpriced
  ComputeDType compute_dtype = ComputeDType::f32;
};

class ReplicaExchange {
 public:
  ReplicaExchange(transport::Communicator& comm, const EpConfig& config, const ReplicaExpertShape& shape = {});

  // The seconds plan_step prices a replica at (all 0 when unpriced), from
  // EpConfig::replica_costs and the shape; source_counts not set.
  balance::ReplicaCosts costs() const;

  int num_local_experts() const { return num_local_experts_; }  // E_l
  int num_slots() const { return num_slots_; }                  // B
  // Bytes of the slot weight and gradient buffers and the incoming gradient
  // rows, kept across steps (charged to the layer's ledger by the layer).
  std::int64_t buffer_bytes() const;

  // Collective (every rank, same step): counts, all-gather, plan. Blocking.
  // Starts the step's statistics afresh. topk_ids [num_tokens * top_k]:
  // this rank's logical experts, in (token, k) order; `tag_base`: the
  // step's (DispatchHandle::tag_base).
  // `weight_version`: the version start_slot_weights will be given (a kept
  // slot at the same version moves no weights, so it is priced so).
  void plan_step(std::span<const std::int32_t> topk_ids, std::uint32_t tag_base,
                 std::optional<std::uint64_t> weight_version = std::nullopt);
  // replica_planning=forecast (balance=dynamic; a no-op otherwise): the
  // counts of the step just run, [R * E] (rank r's pairs of expert e at
  // r * E + e), identical on every rank. The next plan_step looks (counts
  // round and exact plan) only when the plan priced on these places
  // replicas; otherwise it sends every pair home without a collective. The
  // forecast serves one step: a step without one goes home.
  void forecast_from(std::span<const std::int64_t> rank_expert_counts);
  // Adds a chunk's rows of the B slots (local experts E_l + b) to
  // stats().rows_per_slot; the layer calls it beside
  // DispatchStats::count_rows, which counts the home experts'.
  void count_slot_rows(const ExpertRows& rows);
  // This rank's view of the step planned last (reset by plan_step).
  const ReplicaStats& stats() const { return stats_; }
  const balance::ReplicaPlan& plan() const { return plan_; }
  std::int64_t count(int rank, int expert) const { return counts_[rank * num_experts_ + expert]; }
  int experts_per_rank() const { return num_local_experts_ + num_slots_; }

  // The physical destination (ep/step_state.h: rank * (E_l + B) + local
  // index) of every pair of this rank's step, [num_tokens * top_k] in
  // (token, k) order: the positional rule, or with the all-to-all, dedup and
  // replica_choice=dedup the dedup-aware choice (same count per copy).
  void destinations(std::span<const std::int32_t> topk_ids, int top_k, std::int32_t* out) const;

  // Step 3, split so the weights move while the caller works (the first
  // chunk's dispatch, a shared expert). `home` holds the current home
  // weights at `version` and must stay unchanged until finish. Finish waits
  // for the slots' weights and returns the bytes this rank sent.
  void start_slot_weights(const HomeExpertWeights& home, std::uint64_t version, std::uint32_t tag_base);
  std::int64_t finish_slot_weights();
  // Slot b's matrix `part` (0 wi0, 1 wi1, 2 wo) in this exchange's buffers:
  // the weights the experts compute slot b with (zeros for an empty slot,
  // whose group has no rows), and where their backward writes its dW (read
  // by reduce_slot_gradients). Valid after the first start_slot_weights.
  const float* slot_weights(int part, int slot) const;
  float* slot_gradients(int part, int slot);
  // What later plans depend on besides their own step's counts: every slot's
  // expert (dynamic keeps an expert in its slot) and, for balance=periodic,
  // the step count, the count window and the placement held. Identical on
  // every rank. A trainer checkpoints it so that a resumed run plans what an
  // uninterrupted one would, bit for bit.
  std::vector<std::int64_t> planning_state() const;
  // ConfigError when `state` was saved for another rank count, slot count or
  // expert count. Slot weights are resent at the next step (their versions
  // are forgotten).
  void restore_planning_state(const std::vector<std::int64_t>& state);

  // Step 4, split so the gradients move while the caller works (the
  // dispatch's backward). Start sends every slot's gradient (this rank's
  // slots, from slot_gradients(), which must stay unchanged until finish)
  // to its home rank; finish waits, adds the received ones into their home
  // experts' gradients in `home` and returns the bytes this rank sent.
  void start_slot_gradients(std::uint32_t tag_base);
  std::int64_t finish_slot_gradients(const HomeExpertGradients& home);

 private:
  // Pair number `index` (0-based, over the step in (token, k) order) among
  // source rank `source`'s pairs of `expert`, by the positional rule within
  // the source's sub-quotas. O(log C).
  PairDestination destination(int source, int expert, std::int64_t index) const;

  transport::Communicator& comm_;
  EpConfig config_;
  ReplicaExpertShape shape_;
  ReplicaStats stats_;
  std::optional<std::uint64_t> last_weight_version_;  // what every occupied slot holds
  int num_ranks_, num_experts_, num_local_experts_, num_slots_;
  std::vector<int> homes_;
  // Whether plan_step all-gathers each rank's rows per destination rank
  // (the all-to-all with dedup, priced): the token rows dedup leaves.
  bool dedup_rows_priced() const;
  // A step without counts round or plan (priced plans placed nothing
  // lately, or the forecast said so): every pair goes home.
  void skip_planning();
  bool forecasting() const;  // balance=dynamic, replica_planning=forecast
  static constexpr int kMaxStepsSkipped = 16;
  bool skipped_ = false;  // this step
  // replica_costs=measured: config_.replica_costs holds the measured rates.
  bool rates_measured_ = false;
  int skip_left_ = 0;  // steps still to skip
  int next_skip_ = 1;  // steps the next refused plan skips
  // replica_planning=forecast: what forecast_from said of the next step.
  enum class Forecast : std::int64_t { none = 0, home = 1, look = 2 };
  Forecast forecast_ = Forecast::none;
  std::vector<std::int64_t> counts_;        // [R * E] all-gathered
  std::vector<std::int64_t> source_rows_;   // [R * R] with dedup_rows_priced(), else empty
  std::vector<std::int64_t> source_pairs_;  // [R] each rank's (token, k) pairs this step
  balance::ReplicaPlan plan_;
  // [R * copies]: per source, the running sum of the locality-first
  // sub-quotas over each expert's copies (where each copy's run among the
  // source's pairs of the expert ends).
  std::vector<std::int64_t> sub_quota_end_;
  std::vector<int> copy_local_;  // per copy: local expert index on its rank
  // What every slot of every rank holds: expert and weight version.
  std::vector<int> held_expert_;             // [R * B]
  std::vector<std::uint64_t> held_version_;  // [R * B]
  // balance=periodic: steps planned so far, the last balance_window steps'
  // global counts, and the placement held between re-placements.
  std::int64_t step_ = 0;
  std::deque<std::vector<std::int64_t>> count_history_;
  std::vector<int> periodic_slots_;  // [R * B]
  // The slots' weights and gradients, [B, H, F] x2 and [B, F, H] each,
  // allocated at the first step (H and F come with the weights) and kept.
  std::int64_t hidden_ = 0, ffn_ = 0;
  Tensor slot_weights_[3], slot_gradients_[3];
  // Bytes of one weight element on the wire: the compute format (bf16 when
  // compute_dtype=bf16).
  int weight_element_bytes() const;
  std::vector<int> refreshed_slots_;  // this rank's slots receiving weights this step
  // compute_dtype=bf16: the weights this rank sends and receives, as bf16,
  // alive from start to finish and kept across steps.
  std::vector<bf16_t> outgoing_bf16_, incoming_bf16_;
  std::int64_t weight_bytes_in_flight_ = 0;
  // Received slot gradients (a home rank's), kept across steps, and the home
  // expert each is added to.
  std::vector<float> incoming_gradients_;
  std::vector<int> incoming_gradient_experts_;
  std::int64_t gradient_bytes_in_flight_ = 0;
  bool weights_in_flight_ = false, gradients_in_flight_ = false;  // between a start and its finish
  // The transfers in flight: last, so that they end (their destructors wait)
  // before the buffers they read and write go.
  comm::CollectiveHandle weight_transfer_, gradient_transfer_;
};

}  // namespace epmoe::ep
