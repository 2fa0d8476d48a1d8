#include "ep/replica_exchange.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "balance/dedup_aware_choice.h"
#include "balance/periodic_replicas.h"
#include "balance/replica_planner.h"
#include "comm/algorithm.h"
#include "comm/all_gather.h"
#include "comm/collective_handle.h"
#include "comm/tag.h"
#include "core/error.h"
#include "core/modelled_clock.h"
#include "core/timer.h"
#include "ep/collective_tags.h"
#include "ep/replica_rate_probe.h"
#include "kernels/convert.h"

namespace epmoe::ep {

ReplicaExchange::ReplicaExchange(transport::Communicator& comm, const EpConfig& config, const ReplicaExpertShape& shape)
    : comm_(comm),
      config_(config),
      shape_(shape),
      num_ranks_(comm.size()),
      num_experts_(config.num_experts),
      num_local_experts_(config.num_experts / comm.size()),
      num_slots_(config.redundant_slots),
      homes_(balance::contiguous_home_ranks(config.num_experts, comm.size())),
      held_expert_(static_cast<std::size_t>(num_ranks_) * num_slots_, balance::kEmptySlot),
      held_version_(held_expert_.size(), 0) {
  EPMOE_CHECK(config.replicas_enabled());
}

bool ReplicaExchange::dedup_rows_priced() const {
  return config_.balance == BalanceMode::dynamic && config_.dispatch == DispatchKind::alltoall && config_.dedup &&
         costs().token_row_seconds > 0;
}

balance::ReplicaCosts ReplicaExchange::costs() const {
  balance::ReplicaCosts costs;
  const ReplicaCostRates& rates = config_.replica_costs;
  // Unpriced, or replica_costs=measured before its first plan measured them.
  if (rates.compute_flops_per_s <= 0 || rates.link_bytes_per_s <= 0 || shape_.ffn <= 0) return costs;
  const double hidden = static_cast<double>(config_.hidden), ffn = static_cast<double>(shape_.ffn);
  // A row's forward is three H x F products (2 H F FLOPs each); its backward
  // twice that (dlhs and drhs). The layer cannot know whether a backward
  // follows, so the plan assumes training: dearer, never optimistic.
  costs.row_seconds = 18 * hidden * ffn / rates.compute_flops_per_s;
  const double matrices = 3 * hidden * ffn;
  costs.weight_seconds = matrices * weight_element_bytes() / rates.link_bytes_per_s + rates.link_latency_s;
  costs.gradient_seconds = matrices * 4 / rates.link_bytes_per_s + rates.link_latency_s;
  costs.link_latency_seconds = rates.link_latency_s;
  // The counts round: a bidirectional ring all-gather of E (+ R) i64 per
  // rank, R - 1 hops of latency. Refused plans skip it (plan_step).
  const bool all_to_all = config_.dispatch == DispatchKind::alltoall;
  const double count_bytes =
      8.0 * (config_.num_experts + (all_to_all ? 1 : 0) + (all_to_all && config_.dedup ? comm_.size() : 0));
  costs.plan_seconds = (comm_.size() - 1) * (rates.link_latency_s + count_bytes / rates.link_bytes_per_s);
  if (config_.dispatch == DispatchKind::alltoall) {
    // A row on the wire: the token forward (f32 or fp8), its expert output
    // back, the output cotangent out and dx back (f32). The ring moves every
    // token to every rank anyway: a replica adds no token rows there.
    const double token_bytes = config_.token_format == TokenFormat::f32    ? 4
                               : config_.token_format == TokenFormat::bf16 ? 2
                                                                           : 1;
    costs.token_row_seconds = hidden * (token_bytes + 12) / rates.link_bytes_per_s;
    // The weights leave with the plan and move beside the dispatch's token
    // rows; the gradients leave after the experts' backward and move beside
    // dx (in the wire format). Priced so: only what they add to the busiest
    // port (docs/BALANCE.md "Cost model").
    costs.forward_row_seconds = hidden * token_bytes / rates.link_bytes_per_s;
    costs.backward_row_seconds = hidden * (config_.wire_dtype == WireDType::bf16 ? 2 : 4) / rates.link_bytes_per_s;
  }
  return costs;
}

void ReplicaExchange::plan_step(std::span<const std::int32_t> topk_ids, std::uint32_t tag_base,
                                std::optional<std::uint64_t> weight_version) {
  stats_.reset();
  skipped_ = false;
  if (forecasting()) {
    // The look was decided at the end of the last step, for free: no
    // forecast, or one that placed nothing, sends every pair home.
    if (std::exchange(forecast_, Forecast::none) != Forecast::look) {
      skip_planning();
      return;
    }
  } else if (skip_left_ > 0) {
    // Priced plans placed nothing lately: no counts round this step (every
    // rank skips the same steps: the counters follow the identical plans).
    --skip_left_;
    skip_planning();
    return;
  }
  if (config_.replica_costs.measure && !rates_measured_) {
    // replica_costs=measured: the first plan measures the rates every later
    // plan prices at (ep/replica_rate_probe.h).
    std::int64_t probe_bytes = 0;
    config_.replica_costs = measure_replica_rates(comm_,
                                                  {.hidden = config_.hidden,
                                                   .ffn = shape_.ffn,
                                                   .compute_dtype = shape_.compute_dtype,
                                                   .weight_element_bytes = static_cast<int>(weight_element_bytes())},
                                                  tag_base, config_.timeout, probe_bytes);
    rates_measured_ = true;
    stats_.bytes_sent["forward/replica rate probe"] += probe_bytes;
  }
  // Per rank: its E expert counts and, when dedup prices token rows, the
  // rows it sends each rank with every expert at home (its tokens with an
  // expert homed there): R more, in the same all-gather.
  const bool rows_measured = dedup_rows_priced();
  // [E counts], and when token rows are priced (the all-to-all) [its pairs]
  // and with dedup [R rows]: the plan formulas' ·E·8 bytes otherwise.
  const bool pairs_sent = costs().token_row_seconds > 0;
  const int pairs_at = num_experts_, rows_at = num_experts_ + (pairs_sent ? 1 : 0);
  const int per_rank = rows_at + (rows_measured ? num_ranks_ : 0);
  std::vector<std::int64_t> local(static_cast<std::size_t>(per_rank), 0);
  for (const std::int32_t expert : topk_ids) {
    EPMOE_CHECK(expert >= 0 && expert < num_experts_);
    local[expert] += 1;
  }
  if (pairs_sent) local[pairs_at] = static_cast<std::int64_t>(topk_ids.size());
  if (rows_measured) {
    const std::size_t top_k = static_cast<std::size_t>(config_.top_k);
    std::vector<char> hit(static_cast<std::size_t>(num_ranks_));
    for (std::size_t t = 0; t < topk_ids.size() / top_k; ++t) {
      std::fill(hit.begin(), hit.end(), 0);
      for (std::size_t k = 0; k < top_k; ++k) hit[homes_[topk_ids[t * top_k + k]]] = 1;
      for (int r = 0; r < num_ranks_; ++r) local[rows_at + r] += hit[r];
    }
  }
  std::vector<std::int64_t> gathered(static_cast<std::size_t>(num_ranks_) * per_rank, 0);
  comm::ring_all_gather(comm_, {.input = local.data(),
                                .output = gathered.data(),
                                .num_elements_per_rank = per_rank,
                                .dtype = DType::i64,
                                .tag = ep_tag(tag_base, 0, EpOp::replica_counts),
                                .timeout = config_.timeout})
      .wait();
  stats_.bytes_sent["forward/ring_all_gather replica counts"] += 8 * per_rank * (num_ranks_ - 1);  // R-1 rows
  counts_.assign(static_cast<std::size_t>(num_ranks_) * num_experts_, 0);
  source_pairs_.assign(pairs_sent ? static_cast<std::size_t>(num_ranks_) : 0, 0);
  source_rows_.assign(rows_measured ? static_cast<std::size_t>(num_ranks_) * num_ranks_ : 0, 0);
  for (int r = 0; r < num_ranks_; ++r) {
    const std::int64_t* row = gathered.data() + static_cast<std::size_t>(r) * per_rank;
    std::copy(row, row + num_experts_, counts_.begin() + static_cast<std::ptrdiff_t>(r) * num_experts_);
    if (pairs_sent) source_pairs_[r] = row[pairs_at];
    if (rows_measured)
      std::copy(row + rows_at, row + per_rank, source_rows_.begin() + static_cast<std::ptrdiff_t>(r) * num_ranks_);
  }
  std::vector<std::int64_t> global(static_cast<std::size_t>(num_experts_), 0);
  for (int r = 0; r < num_ranks_; ++r)
    for (int e = 0; e < num_experts_; ++e) global[e] += counts_[r * num_experts_ + e];

  // The thread's clock: with clock=modelled the planner is not charged (its
  // time is 0 there, docs/MODELLED_TIME.md), and no wall time enters a
  // modelled run's report.
  const double start = this_thread_clock_seconds();
  if (config_.balance == BalanceMode::periodic) {
    // Re-place from the window every period (never at step 0: no history
    // yet), hold the placement in between; quotas follow this step's counts.
    if (periodic_slots_.empty()) periodic_slots_.assign(held_expert_.size(), balance::kEmptySlot);
    if (step_ > 0 && step_ % config_.balance_period == 0) {
      std::vector<std::int64_t> window(static_cast<std::size_t>(num_experts_), 0);
      for (const auto& counts : count_history_)
        for (int e = 0; e < num_experts_; ++e) window[e] += counts[e];
      // The previous placement keeps an expert that stays on a rank in its
      // slot, whose weights are current there.
      periodic_slots_ = balance::place_periodic_replicas(window, homes_, num_ranks_, num_slots_, periodic_slots_);
    }
    plan_ = balance::plan_with_placement(global, homes_, num_ranks_, num_slots_, periodic_slots_);
    count_history_.push_back(global);
    if (static_cast<int>(count_history_.size()) > config_.balance_window) count_history_.pop_front();
    ++step_;
  } else {
    balance::ReplicaCosts priced = costs();
    if (priced.token_row_seconds > 0) {
      priced.source_counts = counts_;
      priced.source_pairs = source_pairs_;
    }
    priced.source_rows = source_rows_;
    priced.previous_weights_current = weight_version.has_value() && weight_version == last_weight_version_;
    plan_ = balance::plan_replicas(global, homes_,
                                   {.num_ranks = num_ranks_,
                                    .num_redundant_slots_per_rank = num_slots_,
                                    .rebalance_threshold = config_.rebalance_threshold},
                                   held_expert_, priced);
    stats_.priced_at = config_.replica_costs;
    stats_.predicted_saving_seconds = plan_.predicted_saving_seconds;
    stats_.predicted_cost_seconds = plan_.predicted_cost_seconds;
    stats_.refused_replicas = plan_.refused_replicas;
    stats_.refused_saving_seconds = plan_.refused_saving_seconds;
    stats_.refused_cost_seconds = plan_.refused_cost_seconds;
    if (priced.enabled() && !forecasting()) {
      // Nothing pays: the next 1, 2, 4, ... 16 steps skip the counts round
      // (its latency-bound all-gather is all balancing would cost them), and
      // the next plan looks again; a plan that places replicas resets it.
      if (plan_.num_replicas() == 0) {
        skip_left_ = next_skip_;
        next_skip_ = std::min(2 * next_skip_, kMaxStepsSkipped);
      } else {
        next_skip_ = 1;
      }
    }
  }
  stats_.planner_seconds = this_thread_clock_seconds() - start;

  // Per copy: its local expert index.
  copy_local_.assign(plan_.copies.size(), 0);
  const int me = comm_.rank();
  stats_.home_quotas.assign(static_cast<std::size_t>(num_local_experts_), 0);
  stats_.slot_quotas.assign(static_cast<std::size_t>(num_slots_), 0);
  stats_.slot_experts.assign(static_cast<std::size_t>(num_slots_), balance::kEmptySlot);
  for (int b = 0; b < num_slots_; ++b) stats_.slot_experts[b] = plan_.slot_expert(me, b);
  for (int e = 0; e < num_experts_; ++e) {
    std::int64_t end = 0;
    for (int i = plan_.copy_offsets[e]; i < plan_.copy_offsets[e + 1]; ++i) {
      const balance::ExpertCopy& copy = plan_.copies[i];
      end += copy.token_quota;
      if (i == plan_.copy_offsets[e]) {
        EPMOE_CHECK_EQ(copy.rank, homes_[e]);
        copy_local_[i] = e - copy.rank * num_local_experts_;
        if (copy.rank == me) stats_.home_quotas[copy_local_[i]] = copy.token_quota;
        continue;
      }
      int slot = -1;
      for (int b = 0; b < num_slots_; ++b)
        if (plan_.slot_expert(copy.rank, b) == e) slot = b;
      EPMOE_CHECK_GE(slot, 0);  // a replica always sits in a slot of its rank
      copy_local_[i] = num_local_experts_ + slot;
      if (copy.rank == me) stats_.slot_quotas[slot] = copy.token_quota;
    }
    EPMOE_CHECK_EQ(end, global[e]);
  }
  // Per (source, copy): the end of the copy's run among the source's pairs of
  // its expert (prefix sums of the locality-first sub-quotas over the
  // expert's copies), so destination() is a binary search over C copies.
  const std::size_t num_copies = plan_.copies.size();
  sub_quota_end_ = balance::sub_quotas(plan_, counts_);
  for (int s = 0; s < num_ranks_; ++s) {
    std::int64_t* row = sub_quota_end_.data() + static_cast<std::size_t>(s) * num_copies;
    for (int e = 0; e < num_experts_; ++e)
      for (int i = plan_.copy_offsets[e] + 1; i < plan_.copy_offsets[e + 1]; ++i) row[i] += row[i - 1];
  }
  stats_.rows_per_slot.assign(static_cast<std::size_t>(num_slots_), 0);
  stats_.rank_loads_before = plan_.rank_loads_before;
  stats_.rank_loads_after = plan_.rank_loads_after;
  stats_.max_over_mean_before = plan_.before.max_over_mean();
  stats_.max_over_mean_after = plan_.after.max_over_mean();
  stats_.ideal_max_over_mean = plan_.before.ideal_max_over_mean();
  stats_.num_replicas = plan_.num_replicas();
}

bool ReplicaExchange::forecasting() const {
  return config_.balance == BalanceMode::dynamic && config_.replica_planning == ReplicaPlanning::forecast;
}

void ReplicaExchange::forecast_from(std::span<const std::int64_t> rank_expert_counts) {
  if (!forecasting()) return;
  EPMOE_CHECK_EQ(static_cast<std::int64_t>(rank_expert_counts.size()),
                 static_cast<std::int64_t>(num_ranks_) * num_experts_);
  if (config_.replica_costs.measure && !rates_measured_) {
    forecast_ = Forecast::look;  // the next plan measures the rates, then prices
    return;
  }
  std::vector<std::int64_t> global(static_cast<std::size_t>(num_experts_), 0);
  for (int r = 0; r < num_ranks_; ++r)
    for (int e = 0; e < num_experts_; ++e) global[e] += rank_expert_counts[r * num_experts_ + e];
  // Priced as the exact plan would be, but without the dedup rows (the
  // caller's counts have none: a pair counts as a row, the pessimistic
  // side) and with weights always resent (a forecast cannot know the next
  // version).
  balance::ReplicaCosts priced = costs();
  if (priced.token_row_seconds > 0) priced.source_counts = rank_expert_counts;
  const balance::ReplicaPlan forecast = balance::plan_replicas(global, homes_,
                                                               {.num_ranks = num_ranks_,
                                                                .num_redundant_slots_per_rank = num_slots_,
                                                                .rebalance_threshold = config_.rebalance_threshold},
                                                               held_expert_, priced);
  forecast_ = forecast.num_replicas() > 0 ? Forecast::look : Forecast::home;
}

void ReplicaExchange::skip_planning() {
  skipped_ = true;
  stats_.skipped_planning = true;
  // Homes only, every slot empty; no global counts behind it (quotas are
  // not known, so the plan's loads are this rank's view and not reported).
  plan_ = balance::plan_replicas(std::vector<std::int64_t>(static_cast<std::size_t>(num_experts_), 0), homes_,
                                 {.num_ranks = num_ranks_,
                                  .num_redundant_slots_per_rank = num_slots_,
                                  .rebalance_threshold = static_cast<double>(num_ranks_)});
  stats_.slot_experts.assign(static_cast<std::size_t>(num_slots_), balance::kEmptySlot);
  stats_.slot_quotas.assign(static_cast<std::size_t>(num_slots_), 0);
  stats_.rows_per_slot.assign(static_cast<std::size_t>(num_slots_), 0);
}

void ReplicaExchange::count_slot_rows(const ExpertRows& rows) {
  std::vector<std::int64_t>& slot_rows = stats_.rows_per_slot;  // [B] once a step is planned
  for (std::size_t b = 0; b < slot_rows.size(); ++b) slot_rows[b] += rows.group_sizes[num_local_experts_ + b];
}

PairDestination ReplicaExchange::destination(int source, int expert, std::int64_t index) const {
  const std::int64_t* row = sub_quota_end_.data() + static_cast<std::size_t>(source) * plan_.copies.size();
  const std::int64_t* first = row + plan_.copy_offsets[expert];
  const std::int64_t* last = row + plan_.copy_offsets[expert + 1];
  // The first copy whose run among this source's pairs ends after `index`.
  const std::int64_t* at = std::upper_bound(first, last, index);
  EPMOE_CHECK(index >= 0 && at != last);  // beyond the source's count: counts and routing disagree
  const auto copy = static_cast<std::size_t>(at - row);
  return {plan_.copies[copy].rank, copy_local_[copy]};
}

void ReplicaExchange::destinations(std::span<const std::int32_t> topk_ids, int top_k, std::int32_t* out) const {
  const std::int64_t num_pairs = static_cast<std::int64_t>(topk_ids.size());
  const int me = comm_.rank(), stride = experts_per_rank();
  if (skipped_) {
    for (std::int64_t i = 0; i < num_pairs; ++i) {
      const int expert = topk_ids[i], home = homes_[expert];
      out[i] = home * stride + (expert - home * num_local_experts_);
    }
    return;
  }
  if (config_.dispatch == DispatchKind::alltoall && config_.dedup && config_.replica_choice == ReplicaChoice::dedup) {
    // Same per-(source, copy) sub-quotas as the positional rule, so every
    // copy still computes exactly its quota; receivers learn their rows from
    // the routing words and never recompute positions.
    const std::vector<int> choice = balance::dedup_aware_copy_choice(plan_, counts_, me, topk_ids, top_k);
    for (std::int64_t i = 0; i < num_pairs; ++i) {
      const int copy = plan_.copy_offsets[topk_ids[i]] + choice[i];
      out[i] = plan_.copies[copy].rank * stride + copy_local_[copy];
    }
    return;
  }
  std::vector<std::int64_t> seen(static_cast<std::size_t>(num_experts_), 0);
  for (std::int64_t i = 0; i < num_pairs; ++i) {
    const int expert = topk_ids[i];
    const PairDestination dest = destination(me, expert, seen[expert]++);
    out[i] = dest.rank * stride + dest.local_expert;
  }
}

namespace {

transport::Tag slot_tag(std::uint32_t tag_base, int slot, EpOp op, int part) {
  return comm::make_tag(comm::CollectiveKind::point_to_point,
                        ep_tag(tag_base, slot, static_cast<EpOp>(static_cast<std::uint32_t>(op) + part)),
                        comm::Slot::data);
}

// One message of a slot transfer: a send from `from` or a receive into `into`.
struct SlotMessage {
  int peer;
  transport::Tag tag;
  const void* from;  // a send, or
  void* into;        // a receive
  std::int64_t num_bytes;
};

// Posts `messages` and waits for them on a progress thread, as one
// collective named `name` (comm/collective_handle.h): the transfer moves
// while the rank computes, and a trace shows it as one event from its launch
// to its last message's end. No messages: nothing is launched.
comm::CollectiveHandle launch_slot_transfer(transport::Communicator& comm, std::string name,
                                            std::chrono::milliseconds timeout, std::vector<SlotMessage> messages) {
  if (messages.empty()) return {};
  // The requests live with the collective's parts, which are released when
  // it ends, so none outlives the buffers it points into.
  auto requests = std::make_shared<std::vector<std::unique_ptr<transport::Request>>>();
  return comm::launch_collective(
      comm, std::move(name), timeout,
      [&comm, requests, messages = std::move(messages)](transport::Deadline) {
        for (const SlotMessage& m : messages) {
          requests->push_back(m.into != nullptr ? comm.irecv(m.peer, m.tag, m.into, m.num_bytes)
                                                : comm.isend(m.peer, m.tag, m.from, m.num_bytes));
        }
      },
      [requests](transport::Deadline deadline) {
        for (auto& request : *requests) request->wait_until(deadline);
      });
}

}  // namespace

namespace {
// 3 appends the forecast for the next step (replica_planning=forecast); 2
// (read as no forecast: the next step goes home) the priced plans' skip
// counters; 1 (before them) is read with 0s.
constexpr std::int64_t kPlanningStateFormat = 3;
}  // namespace

// Layout: format, R, B, E, step, held experts [R*B], periodic placement
// length and values, window length, window counts [length * E].
std::vector<std::int64_t> ReplicaExchange::planning_state() const {
  std::vector<std::int64_t> state = {kPlanningStateFormat, num_ranks_, num_slots_, num_experts_, step_};
  state.insert(state.end(), held_expert_.begin(), held_expert_.end());
  state.push_back(static_cast<std::int64_t>(periodic_slots_.size()));
  state.insert(state.end(), periodic_slots_.begin(), periodic_slots_.end());
  state.push_back(static_cast<std::int64_t>(count_history_.size()));
  for (const auto& counts : count_history_) state.insert(state.end(), counts.begin(), counts.end());
  state.push_back(skip_left_);
  state.push_back(next_skip_);
  state.push_back(static_cast<std::int64_t>(forecast_));
  return state;
}

void ReplicaExchange::restore_planning_state(const std::vector<std::int64_t>& state) {
  const auto fail = [](const std::string& why) {
    throw ConfigError("the checkpoint's replica balancing state " + why);
  };
  if (state.size() < 5 || state[0] < 1 || state[0] > kPlanningStateFormat)
    fail("has format " + std::to_string(state.empty() ? 0 : state[0]) + "; this epmoe reads formats 1 to " +
         std::to_string(kPlanningStateFormat));
  if (state[1] != num_ranks_ || state[2] != num_slots_ || state[3] != num_experts_) {
    fail("was saved for ranks=" + std::to_string(state[1]) + " redundant_slots=" + std::to_string(state[2]) +
         " num_experts=" + std::to_string(state[3]) + "; this run has ranks=" + std::to_string(num_ranks_) +
         " redundant_slots=" + std::to_string(num_slots_) + " num_experts=" + std::to_string(num_experts_));
  }
  std::size_t at = 4;
  const auto take = [&](std::size_t n) {
    if (state.size() < at + n) fail("is truncated");
    const auto begin = state.begin() + static_cast<std::ptrdiff_t>(at);
    at += n;
    return std::vector<std::int64_t>(begin, begin + static_cast<std::ptrdiff_t>(n));
  };
  step_ = take(1)[0];
  const std::vector<std::int64_t> held = take(held_expert_.size());
  held_expert_.assign(held.begin(), held.end());
  std::fill(held_version_.begin(), held_version_.end(), 0);  // weights are not in the buffers: resend
  const std::vector<std::int64_t> placement = take(static_cast<std::size_t>(take(1)[0]));
  periodic_slots_.assign(placement.begin(), placement.end());
  const std::int64_t window = take(1)[0];
  count_history_.clear();
  for (std::int64_t w = 0; w < window; ++w) count_history_.push_back(take(static_cast<std::size_t>(num_experts_)));
  skip_left_ = 0;
  next_skip_ = 1;
  forecast_ = Forecast::none;
  if (state[0] >= 2) {
    const std::vector<std::int64_t> skips = take(2);
    if (skips[0] < 0 || skips[0] > kMaxStepsSkipped || skips[1] < 1 || skips[1] > kMaxStepsSkipped)
      fail("has skip counters out of range");
    skip_left_ = static_cast<int>(skips[0]);
    next_skip_ = static_cast<int>(skips[1]);
  }
  if (state[0] >= 3) {
    const std::int64_t forecast = take(1)[0];
    if (forecast < 0 || forecast > static_cast<std::int64_t>(Forecast::look)) fail("has a forecast out of range");
    forecast_ = static_cast<Forecast>(forecast);
  }
  if (at != state.size()) fail("has trailing values");
}

const float* ReplicaExchange::slot_weights(int part, int slot) const {
  EPMOE_CHECK(part >= 0 && part < 3 && slot >= 0 && slot < num_slots_ && !slot_weights_[part].empty());
  return slot_weights_[part].data<float>() + slot * hidden_ * ffn_;
}

float* ReplicaExchange::slot_gradients(int part, int slot) {
  EPMOE_CHECK(part >= 0 && part < 3 && slot >= 0 && slot < num_slots_ && !slot_gradients_[part].empty());
  return slot_gradients_[part].data<float>() + slot * hidden_ * ffn_;
}

int ReplicaExchange::weight_element_bytes() const { return shape_.compute_dtype == ComputeDType::bf16 ? 2 : 4; }

void ReplicaExchange::start_slot_weights(const HomeExpertWeights& home, std::uint64_t version, std::uint32_t tag_base) {
  // A step abandoned between start and finish (an error, or dropped after
  // begin_forward) left its transfer: it ends here (every rank posted its
  // side at that start, so it completes unless the group failed).
  weight_transfer_ = comm::CollectiveHandle();
  const std::int64_t hidden = home.wi0.dim(1), ffn = home.wi0.dim(2);
  EPMOE_CHECK((home.wi0.has_shape({num_local_experts_, hidden, ffn})));
  EPMOE_CHECK((home.wi1.has_shape({num_local_experts_, hidden, ffn})));
  EPMOE_CHECK((home.wo.has_shape({num_local_experts_, ffn, hidden})));
  EPMOE_CHECK(home.wi0.is_contiguous() && home.wi1.is_contiguous() && home.wo.is_contiguous());
  if (slot_weights_[0].empty()) {
    hidden_ = hidden;
    ffn_ = ffn;
    for (int p = 0; p < 3; ++p) {
      const Shape shape = p < 2 ? Shape{num_slots_, hidden_, ffn_} : Shape{num_slots_, ffn_, hidden_};
      slot_weights_[p] = Tensor::zeros(DType::f32, shape);
      slot_gradients_[p] = Tensor::zeros(DType::f32, shape);
    }
  }
  EPMOE_CHECK(hidden == hidden_ && ffn == ffn_);
  const std::int64_t n = hidden_ * ffn_;
  const float* home_parts[3] = {home.wi0.data<float>(), home.wi1.data<float>(), home.wo.data<float>()};
  const int me = comm_.rank();
  // This step's transfers: (peer, slot, home local expert) sent, (peer, slot) received.
  struct Transfer {
    int peer, slot;
    std::int64_t local_expert;
  };
  std::vector<Transfer> sends;
  refreshed_slots_.clear();
  std::vector<int> receive_from;
  for (int r = 0; r < num_ranks_; ++r)
    for (int b = 0; b < num_slots_; ++b) {
      const std::size_t at = static_cast<std::size_t>(r) * num_slots_ + b;
      const int expert = plan_.slot_expert(r, b);
      if (expert == balance::kEmptySlot) {
        held_expert_[at] = balance::kEmptySlot;  // keep nothing stale in the plan's view
        continue;
      }
      if (held_expert_[at] == expert && held_version_[at] == version) continue;  // current
      held_expert_[at] = expert;
      held_version_[at] = version;
      const int home_rank = homes_[expert];
      if (r == me) {
        refreshed_slots_.push_back(b);
        receive_from.push_back(home_rank);
      }
      if (home_rank == me) sends.push_back({r, b, expert - me * num_local_experts_});
    }
  // compute_dtype=bf16: the weights travel as the bf16 the experts' GEMMs
  // read (kernels/convert.h, the same rounding the GEMM's own conversion
  // does), half the bytes; the slot is expanded back to f32, which the GEMM
  // turns into the very same bf16 bits (a bf16 value converts exactly).
  const bool narrow = weight_element_bytes() == 2;
  const std::int64_t message_bytes = n * weight_element_bytes();
  if (narrow) {
    outgoing_bf16_.resize(sends.size() * 3 * n);
    incoming_bf16_.resize(refreshed_slots_.size() * 3 * n);
  }
  if (narrow && !sends.empty()) {
    ComputeScope scope("replica weights to bf16", {.flops = 0, .bytes = static_cast<double>(sends.size() * 3 * n * 6)});
    for (std::size_t i = 0; i < sends.size(); ++i)
      for (int p = 0; p < 3; ++p)
        convert(std::span<const float>(home_parts[p] + sends[i].local_expert * n, n),
                std::span<bf16_t>(outgoing_bf16_.data() + (i * 3 + p) * n, n));
  }
  std::vector<SlotMessage> messages;
  for (std::size_t i = 0; i < refreshed_slots_.size(); ++i) {
    const int b = refreshed_slots_[i];
    for (int p = 0; p < 3; ++p) {
      void* into = narrow ? static_cast<void*>(incoming_bf16_.data() + (i * 3 + p) * n)
                          : static_cast<void*>(slot_weights_[p].data<float>() + b * n);
      messages.push_back({receive_from[i], slot_tag(tag_base, b, EpOp::replica_wi0, p), nullptr, into, message_bytes});
    }
  }
  std::int64_t bytes = 0;
  for (std::size_t i = 0; i < sends.size(); ++i)
    for (int p = 0; p < 3; ++p) {
      const void* from = narrow ? static_cast<const void*>(outgoing_bf16_.data() + (i * 3 + p) * n)
                                : static_cast<const void*>(home_parts[p] + sends[i].local_expert * n);
      messages.push_back(
          {sends[i].peer, slot_tag(tag_base, sends[i].slot, EpOp::replica_wi0, p), from, nullptr, message_bytes});
      bytes += message_bytes;
    }
  weight_transfer_ = launch_slot_transfer(
      comm_, comm::detail::collective_name("replica weights", ep_tag(tag_base, 0, EpOp::replica_wi0)), config_.timeout,
      std::move(messages));
  weights_in_flight_ = true;
  weight_bytes_in_flight_ = bytes;
  stats_.slots_refreshed = static_cast<int>(refreshed_slots_.size());
  last_weight_version_ = version;
}

std::int64_t ReplicaExchange::finish_slot_weights() {
  EPMOE_CHECK(weights_in_flight_);
  weights_in_flight_ = false;
  weight_transfer_.wait();
  if (weight_element_bytes() == 2 && !refreshed_slots_.empty()) {
    const std::int64_t n = hidden_ * ffn_;
    ComputeScope scope("replica weights from bf16",
                       {.flops = 0, .bytes = static_cast<double>(refreshed_slots_.size() * 3 * n * 6)});
    for (std::size_t i = 0; i < refreshed_slots_.size(); ++i)
      for (int p = 0; p < 3; ++p)
        convert(std::span<const bf16_t>(incoming_bf16_.data() + (i * 3 + p) * n, n),
                std::span<float>(slot_weights_[p].data<float>() + refreshed_slots_[i] * n, n));
  }
  stats_.bytes_sent["forward/replica weights"] += weight_bytes_in_flight_;
  return std::exchange(weight_bytes_in_flight_, 0);
}

void ReplicaExchange::start_slot_gradients(std::uint32_t tag_base) {
  gradient_transfer_ = comm::CollectiveHandle();  // an abandoned step's, as in start_slot_weights
  const int me = comm_.rank();
  const std::int64_t n = hidden_ * ffn_;
  std::vector<SlotMessage> messages;
  // Received slot gradients, in ascending (rank, slot) order, with the home
  // expert each is added to; their buffer is kept from step to step.
  incoming_gradient_experts_.clear();
  std::int64_t bytes = 0;
  for (int r = 0; r < num_ranks_; ++r)
    for (int b = 0; b < num_slots_; ++b) {
      const int expert = plan_.slot_expert(r, b);
      if (expert == balance::kEmptySlot) continue;
      if (homes_[expert] == me) incoming_gradient_experts_.push_back(expert - me * num_local_experts_);
    }
  incoming_gradients_.resize(incoming_gradient_experts_.size() * 3 * n);
  std::size_t next = 0;
  for (int r = 0; r < num_ranks_; ++r)
    for (int b = 0; b < num_slots_; ++b) {
      const int expert = plan_.slot_expert(r, b);
      if (expert == balance::kEmptySlot) continue;
      const int home_rank = homes_[expert];
      if (r == me) {
        for (int p = 0; p < 3; ++p) {
          messages.push_back(
              {home_rank, slot_tag(tag_base, b, EpOp::replica_dwi0, p), slot_gradients(p, b), nullptr, n * 4});
          bytes += n * 4;
        }
      }
      if (home_rank == me) {
        float* in = incoming_gradients_.data() + next++ * 3 * n;
        for (int p = 0; p < 3; ++p)
          messages.push_back({r, slot_tag(tag_base, b, EpOp::replica_dwi0, p), nullptr, in + p * n, n * 4});
      }
    }
  gradient_transfer_ = launch_slot_transfer(
      comm_, comm::detail::collective_name("replica gradients", ep_tag(tag_base, 0, EpOp::replica_dwi0)),
      config_.timeout, std::move(messages));
  gradients_in_flight_ = true;
  gradient_bytes_in_flight_ = bytes;
}

std::int64_t ReplicaExchange::finish_slot_gradients(const HomeExpertGradients& home) {
  EPMOE_CHECK(gradients_in_flight_);
  gradients_in_flight_ = false;
  gradient_transfer_.wait();
  const std::int64_t n = hidden_ * ffn_;
  float* home_parts[3] = {home.dwi0, home.dwi1, home.dwo};
  for (std::size_t i = 0; i < incoming_gradient_experts_.size(); ++i) {
    for (int p = 0; p < 3; ++p) {
      const float* src = incoming_gradients_.data() + (i * 3 + p) * n;
      float* dst = home_parts[p] + incoming_gradient_experts_[i] * n;
      for (std::int64_t j = 0; j < n; ++j) dst[j] += src[j];
    }
  }
  stats_.bytes_sent["backward/replica gradients"] += gradient_bytes_in_flight_;
  return std::exchange(gradient_bytes_in_flight_, 0);
}

std::int64_t ReplicaExchange::buffer_bytes() const {
  std::int64_t bytes = static_cast<std::int64_t>(incoming_gradients_.capacity() * sizeof(float));
  for (int p = 0; p < 3; ++p) bytes += slot_weights_[p].size_bytes() + slot_gradients_[p].size_bytes();
  bytes += static_cast<std::int64_t>((outgoing_bf16_.capacity() + incoming_bf16_.capacity()) * sizeof(bf16_t));
  return bytes;
}

}  // namespace epmoe::ep
