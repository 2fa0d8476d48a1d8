#include "balance/replica_planner.h"

#include <algorithm>
#include <array>
#include <limits>

#include "core/error.h"

namespace epmoe::balance {
namespace {

// Which donor's run a receiver's next slot takes (see replica_planner.h).
enum class RunRule {
  largest,         // the largest run of any donor
  finish_or_fill,  // a donor's whole remaining excess if it fits (not in the
                   // receiver's last slot), else the smallest run that fills
                   // the receiver, else the largest
};

constexpr int kFinishingLookahead = 8;

// One water fill (see replica_planner.h) and the state it leaves. fill() starts
// from the homes every time, so bisection over targets reuses the buffers and
// allocates nothing per fill: a plan for E=256, R=64, B=2 takes microseconds
// (bench/balance).
class WaterFill {
 public:
  WaterFill(std::span<const std::int64_t> expert_counts, std::span<const int> home_rank_of_expert,
            const ReplicaPlannerOptions& options, std::span<const int> previous_slot_experts, const ReplicaCosts& costs)
      : counts_(expert_counts),
        homes_(home_rank_of_expert),
        costs_(costs),
        source_counts_(costs.source_counts),
        previous_slots_(previous_slot_experts),
        num_experts_(static_cast<int>(expert_counts.size())),
        num_ranks_(options.num_ranks),
        num_slots_(options.num_redundant_slots_per_rank),
        home_loads_(num_ranks_, 0),
        home_offsets_(num_ranks_ + 1, 0),
        loads_(num_ranks_),
        home_quota_(num_experts_),
        used_slots_(num_ranks_),
        slot_experts_(static_cast<std::size_t>(num_ranks_) * num_slots_),
        slot_quota_(slot_experts_.size()) {
    for (int e = 0; e < num_experts_; ++e) {
      home_loads_[homes_[e]] += counts_[e];
      ++home_offsets_[homes_[e] + 1];
    }
    for (int r = 0; r < num_ranks_; ++r) home_offsets_[r + 1] += home_offsets_[r];
    std::vector<int> cursor(home_offsets_.begin(), home_offsets_.end() - 1);
    experts_by_home_.resize(num_experts_);
    for (int e = 0; e < num_experts_; ++e) experts_by_home_[cursor[homes_[e]]++] = e;
    // Each rank's experts by count, largest first (lowest expert on ties).
    for (int r = 0; r < num_ranks_; ++r) {
      std::sort(experts_by_home_.begin() + home_offsets_[r], experts_by_home_.begin() + home_offsets_[r + 1],
                [&](int a, int b) { return counts_[a] != counts_[b] ? counts_[a] > counts_[b] : a < b; });
    }
    experts_by_count_ = experts_by_home_;
    donors_.reserve(num_ranks_);
    // Every fill starts from the homes, so its receivers (the ranks below its
    // target, emptiest first, lowest rank on ties) are a prefix of the ranks
    // by home load: sorted once here, not per fill.
    ranks_by_home_load_.resize(num_ranks_);
    for (int r = 0; r < num_ranks_; ++r) ranks_by_home_load_[r] = r;
    std::sort(ranks_by_home_load_.begin(), ranks_by_home_load_.end(),
              [&](int a, int b) { return home_loads_[a] != home_loads_[b] ? home_loads_[a] < home_loads_[b] : a < b; });
    if (costs_.enabled()) {
      per_rank_.assign(static_cast<std::size_t>(4) * num_ranks_, 0);
      if (prices_tokens()) {
        // Pairs each rank's tokens bring, and those computed where they are
        // (at their home), with every expert at home; and the rows that
        // cross each rank's link, in and out: the pairs, or with dedup the
        // measured rows (ReplicaCosts::source_rows).
        source_pairs_.assign(num_ranks_, 0);
        home_local_.assign(num_ranks_, 0);
        for (int r = 0; r < num_ranks_; ++r) {
          const std::int64_t* row = source_counts_.data() + static_cast<std::size_t>(r) * num_experts_;
          if (costs_.source_pairs.empty()) {
            std::int64_t pairs = 0;  // a plain row sum: vectorised
            for (int e = 0; e < num_experts_; ++e) pairs += row[e];
            source_pairs_[r] = pairs;
          } else {
            source_pairs_[r] = costs_.source_pairs[r];
          }
          for (int i = home_offsets_[r]; i < home_offsets_[r + 1]; ++i) home_local_[r] += row[experts_by_home_[i]];
        }
        rows_in_.assign(num_ranks_, 0);
        rows_out_.assign(num_ranks_, 0);
        for (int r = 0; r < num_ranks_; ++r) {
          if (costs_.source_rows.empty()) {
            rows_in_[r] = home_loads_[r] - home_local_[r];
            rows_out_[r] = source_pairs_[r] - home_local_[r];
          } else {
            for (int other = 0; other < num_ranks_; ++other) {
              if (other == r) continue;
              rows_in_[r] += costs_.source_rows[static_cast<std::size_t>(other) * num_ranks_ + r];
              rows_out_[r] += costs_.source_rows[static_cast<std::size_t>(r) * num_ranks_ + other];
            }
          }
          home_link_rows_ = std::max({home_link_rows_, rows_in_[r], rows_out_[r]});
        }
        scratch_.assign(static_cast<std::size_t>(3) * num_ranks_, 0);
        rows_in_after_.assign(num_ranks_, 0);
        rows_out_after_.assign(num_ranks_, 0);
        evaluated_.assign(num_experts_, 0);
      }
    }
  }

  // A plan's predicted seconds (ReplicaCosts).
  struct Value {
    double saving = 0, cost = 0;
    int replicas = 0;
    double net() const { return saving - cost; }
  };

  // Prices the plan the last fill left (replica_planner.h).
  Value evaluate() {
    Value value;
    if (!costs_.enabled()) return value;
    const std::int64_t max_after = *std::max_element(loads_.begin(), loads_.end());
    const std::int64_t max_before = *std::max_element(home_loads_.begin(), home_loads_.end());
    value.saving = static_cast<double>(max_before - max_after) * costs_.row_seconds;
    // Per rank: weights in, weights out, gradients out, gradients in.
    std::fill(per_rank_.begin(), per_rank_.end(), 0);
    std::int64_t* weights_in = per_rank_.data();
    std::int64_t* weights_out = weights_in + num_ranks_;
    std::int64_t* gradients_out = weights_out + num_ranks_;
    std::int64_t* gradients_in = gradients_out + num_ranks_;
    for (int r = 0; r < num_ranks_; ++r)
      for (int b = 0; b < used_slots_[r]; ++b) {
        const int expert = slot_experts_[static_cast<std::size_t>(r) * num_slots_ + b];
        const int home = homes_[expert];
        ++value.replicas;
        ++gradients_out[r];
        ++gradients_in[home];
        if (!weights_current(r, expert)) {
          ++weights_in[r];
          ++weights_out[home];
        }
      }
    std::int64_t weight_link = 0, gradient_link = 0;
    for (int r = 0; r < num_ranks_; ++r) {
      weight_link = std::max({weight_link, weights_in[r], weights_out[r]});
      gradient_link = std::max({gradient_link, gradients_in[r], gradients_out[r]});
    }
    value.cost = value.replicas > 0 ? costs_.plan_seconds : 0;
    if (!prices_tokens() || value.replicas == 0) {
      value.cost += static_cast<double>(weight_link) * costs_.weight_seconds +
                    static_cast<double>(gradient_link) * costs_.gradient_seconds;
      return value;
    }
    // Rows off the busiest link save as much as they cost when added: the
    // all-to-all's time goes to its busiest link (the hot home's, under
    // packed hot experts).
    const double rows = link_rows_after() - static_cast<double>(home_link_rows_);
    (rows < 0 ? value.saving : value.cost) += std::abs(rows) * costs_.token_row_seconds;
    if (costs_.forward_row_seconds > 0) {
      // The weights move beside the dispatch's rows: a rank's ingress
      // carries the rows it computes for others and its slots' weights, its
      // egress its tokens' rows sent away and the weights it feeds; they
      // cost what they add to the busiest port. The gradients likewise
      // beside dx, which flows the other way (a rank's egress carries the
      // dx of the rows it computed for others).
      // Each transfer holds a port for its bytes only: its latency overlaps
      // the next message's bytes, and the rows beside it pay the latency
      // anyway (ReplicaCosts::link_latency_seconds).
      value.cost += added_to_busiest_port(costs_.forward_row_seconds, weights_in, weights_out,
                                          bytes_seconds(costs_.weight_seconds));
      value.cost += added_to_busiest_port(costs_.backward_row_seconds, gradients_out, gradients_in,
                                          bytes_seconds(costs_.gradient_seconds));
    } else {
      value.cost += static_cast<double>(weight_link) * costs_.weight_seconds +
                    static_cast<double>(gradient_link) * costs_.gradient_seconds;
    }
    return value;
  }

  // What the transfers add to the busiest port beside the rows of the last
  // link_rows_after() at `row_seconds` a row: `beside_rows_in[r]` transfers
  // share the port that carries rank r's rows in (the rows it computes for
  // others; back, their dx), `beside_rows_out[r]` the port of its rows out.
  double added_to_busiest_port(double row_seconds, const std::int64_t* beside_rows_in,
                               const std::int64_t* beside_rows_out, double transfer_seconds) const {
    double rows_only = 0, with_transfers = 0;
    for (int r = 0; r < num_ranks_; ++r) {
      const double in = rows_in_after_[r] * row_seconds, out = rows_out_after_[r] * row_seconds;
      rows_only = std::max({rows_only, in, out});
      with_transfers = std::max({with_transfers, in + static_cast<double>(beside_rows_in[r]) * transfer_seconds,
                                 out + static_cast<double>(beside_rows_out[r]) * transfer_seconds});
    }
    return with_transfers - rows_only;
  }

  // A transfer's time on the port without the link's latency (a gradient
  // priced at 0, inference, stays 0).
  double bytes_seconds(double transfer_seconds) const {
    return std::max(0.0, transfer_seconds - costs_.link_latency_seconds);
  }

  // Whether a run of `rows` of `expert` into a new slot of `receiver` pays
  // for that slot's own transfers.
  bool pays(int receiver, int expert, std::int64_t rows) {
    if (!costs_.enabled()) return true;
    const double slot_cost = costs_.gradient_seconds + (weights_current(receiver, expert) ? 0 : costs_.weight_seconds);
    const bool paid = static_cast<double>(rows) * costs_.row_seconds > slot_cost;
    unpaid_runs_ += !paid;  // what pricing the runs would have refused
    return paid || !price_runs_;
  }
  // Runs of the last fill that did not pay for their slot (placed or not).
  int unpaid_runs() const { return unpaid_runs_; }

  const std::vector<std::int64_t>& home_loads() const { return home_loads_; }

  // A fill's plan, kept so the priced search returns the candidate it chose
  // without filling it again (a fill costs more than these copies).
  struct Saved {
    std::vector<std::int64_t> loads, home_quota, slot_quota;
    std::vector<int> used_slots, slot_experts;
  };
  void save(Saved& saved) const {
    saved.loads = loads_;
    saved.home_quota = home_quota_;
    saved.slot_quota = slot_quota_;
    saved.used_slots = used_slots_;
    saved.slot_experts = slot_experts_;
  }
  // What finish() reads (experts_by_home_ and the donors are fill scratch).
  void restore(const Saved& saved) {
    loads_ = saved.loads;
    home_quota_ = saved.home_quota;
    slot_quota_ = saved.slot_quota;
    used_slots_ = saved.used_slots;
    slot_experts_ = saved.slot_experts;
  }
  // Costs on: whether fill() refuses the runs that do not pay for their slot.
  void price_runs(bool on) { price_runs_ = on && costs_.enabled(); }

  // Fills towards `target`; returns the max rank load reached (<= target when
  // the slots allowed it). The state holds the plan afterwards. A fill opens
  // at most `slot_limit` slots per rank (B when 0).
  std::int64_t fill(std::int64_t target, RunRule rule, int slot_limit = 0) {
    const int slots = slot_limit > 0 ? std::min(slot_limit, num_slots_) : num_slots_;
    reset();
    unpaid_runs_ = 0;
    std::int64_t excess = 0;
    donors_.clear();
    for (int r = 0; r < num_ranks_; ++r) {
      if (loads_[r] > target) {
        donors_.push_back(r);
        excess += loads_[r] - target;
      }
    }
    std::sort(donors_.begin(), donors_.end(), [&](int a, int b) { return gives_before(a, b, target); });
    for (const int receiver : ranks_by_home_load_) {
      if (home_loads_[receiver] >= target) break;  // the receivers end
      while (excess > 0 && used_slots_[receiver] < slots && loads_[receiver] < target) {
        int at = choose_donor(target - loads_[receiver], used_slots_[receiver] + 1 == slots, target, rule);
        if (at < 0) break;
        std::int64_t run = std::min(run_of(donors_[at], target), target - loads_[receiver]);
        if (!pays(receiver, largest_expert(donors_[at]), run)) {
          // The largest run is the last chance for this receiver's slot.
          at = 0;
          run = std::min(run_of(donors_[at], target), target - loads_[receiver]);
          if (!pays(receiver, largest_expert(donors_[at]), run)) break;
        }
        const int donor = donors_[at];
        give_run(donor, receiver, run);
        excess -= run;
        // The donor's run only shrank: sink it to its place.
        for (std::size_t i = at; i + 1 < donors_.size() && gives_before(donors_[i + 1], donors_[i], target); ++i) {
          std::swap(donors_[i], donors_[i + 1]);
        }
      }
      if (excess == 0) break;
    }
    return *std::max_element(loads_.begin(), loads_.end());
  }

  ReplicaPlan finish() {
    if (!previous_slots_.empty()) keep_previous_slot_positions(slot_experts_, previous_slots_, num_slots_, slot_quota_);
    ReplicaPlan plan;
    plan.num_experts = num_experts_;
    plan.num_ranks = num_ranks_;
    plan.num_redundant_slots_per_rank = num_slots_;
    std::vector<int> num_copies(num_experts_, 1);
    for (const int expert : slot_experts_) {
      if (expert != kEmptySlot) ++num_copies[expert];
    }
    plan.copy_offsets.assign(num_experts_ + 1, 0);
    for (int e = 0; e < num_experts_; ++e) plan.copy_offsets[e + 1] = plan.copy_offsets[e] + num_copies[e];
    plan.copies.resize(plan.copy_offsets[num_experts_]);
    std::vector<int> cursor(num_experts_);
    for (int e = 0; e < num_experts_; ++e) {
      plan.copies[plan.copy_offsets[e]] = {homes_[e], home_quota_[e]};
      cursor[e] = plan.copy_offsets[e] + 1;
    }
    // Slots in index order are rank-major: replicas come out by ascending rank.
    for (std::size_t slot = 0; slot < slot_experts_.size(); ++slot) {
      const int expert = slot_experts_[slot];
      if (expert == kEmptySlot) continue;
      plan.copies[cursor[expert]++] = {static_cast<int>(slot) / num_slots_, slot_quota_[slot]};
    }
    plan.slot_experts = slot_experts_;
    plan.rank_loads_before = home_loads_;
    plan.rank_loads_after = loads_;
    plan.before = measure_load_imbalance(plan.rank_loads_before);
    plan.after = measure_load_imbalance(plan.rank_loads_after);
    return plan;
  }

 private:
  bool prices_tokens() const { return costs_.token_row_seconds > 0 && !source_counts_.empty(); }
  std::int64_t source_count(int rank, int expert) const {
    return source_counts_[static_cast<std::size_t>(rank) * num_experts_ + expert];
  }
  int largest_expert(int donor) const { return experts_by_home_[home_offsets_[donor]]; }

  // Whether `receiver` held `expert` in a slot at the previous plan, with
  // its weights still current.
  bool weights_current(int receiver, int expert) const {
    if (!costs_.previous_weights_current || previous_slots_.empty()) return false;
    const int* held = previous_slots_.data() + static_cast<std::size_t>(receiver) * num_slots_;
    return std::find(held, held + num_slots_, expert) != held + num_slots_;
  }

  // The most token rows any rank's link carries one way under the last
  // fill. A rank receives the rows it computes that are not its own tokens'
  // and sends its tokens' pairs computed elsewhere. Each copy computes its
  // own rank's pairs first (balance/replica_plan.h), so for a replicated
  // expert its home keeps min(home quota, its own pairs) local, a replica
  // min(quota, its rank's pairs). With dedup (source_rows), a home's
  // remaining remote pairs keep the rows per pair measured without
  // replicas, while every remote pair a replica takes is a row of its own
  // and a rank's sends never shrink below the measured rows: replicas
  // break dedup's sharing, and the estimate takes the worst of it.
  double link_rows_after() {
    std::int64_t* local = scratch_.data();
    std::int64_t* home_remote = local + num_ranks_;
    std::copy(home_local_.begin(), home_local_.end(), local);
    for (int r = 0; r < num_ranks_; ++r) home_remote[r] = home_loads_[r] - home_local_[r];
    // The replicated experts' homes, each expert once: found from the slots
    // (R * B), not by a pass over all E experts.
    ++evaluation_;
    for (int r = 0; r < num_ranks_; ++r)
      for (int b = 0; b < used_slots_[r]; ++b) {
        const int e = slot_experts_[static_cast<std::size_t>(r) * num_slots_ + b];
        if (evaluated_[e] == evaluation_) continue;
        evaluated_[e] = evaluation_;
        const int home = homes_[e];
        const std::int64_t own = source_count(home, e), kept = std::min(home_quota_[e], own);
        local[home] += kept - own;
        home_remote[home] += (home_quota_[e] - kept) - (counts_[e] - own);
      }
    // Replica remote pairs per rank (not in per_rank_: evaluate() reads the
    // transfers there afterwards).
    std::int64_t* replica_remote = home_remote + num_ranks_;
    std::fill(replica_remote, replica_remote + num_ranks_, 0);
    for (int r = 0; r < num_ranks_; ++r)
      for (int b = 0; b < used_slots_[r]; ++b) {
        const std::size_t slot = static_cast<std::size_t>(r) * num_slots_ + b;
        const std::int64_t kept = std::min(slot_quota_[slot], source_count(r, slot_experts_[slot]));
        local[r] += kept;
        replica_remote[r] += slot_quota_[slot] - kept;
      }
    const bool dedup = !costs_.source_rows.empty();
    double rows = 0;
    for (int r = 0; r < num_ranks_; ++r) {
      const std::int64_t home_pairs_before = home_loads_[r] - home_local_[r];
      const double in_per_pair = dedup && home_pairs_before > 0
                                     ? static_cast<double>(rows_in_[r]) / static_cast<double>(home_pairs_before)
                                     : 1;
      const double in = static_cast<double>(home_remote[r]) * in_per_pair + static_cast<double>(replica_remote[r]);
      const std::int64_t out_pairs = source_pairs_[r] - local[r];
      const double out =
          dedup ? static_cast<double>(rows_out_[r] +
                                      std::max<std::int64_t>(0, out_pairs - (source_pairs_[r] - home_local_[r])))
                : static_cast<double>(out_pairs);
      rows_in_after_[r] = in;
      rows_out_after_[r] = out;
      rows = std::max({rows, in, out});
    }
    return rows;
  }

  // The largest run `donor` can give: min(its excess, its largest remaining
  // home quota).
  std::int64_t run_of(int donor, std::int64_t target) const {
    return std::min(loads_[donor] - target, home_quota_[experts_by_home_[home_offsets_[donor]]]);
  }

  // Donors ordered by run, largest first, lowest rank on ties.
  bool gives_before(int a, int b, std::int64_t target) const {
    const std::int64_t run_a = run_of(a, target), run_b = run_of(b, target);
    return run_a != run_b ? run_a > run_b : a < b;
  }

  // The position in donors_ of the donor whose run goes into a receiver with
  // `room`; -1 when no donor has anything left. donors_ is ordered by
  // gives_before, so each rule is a search, not a scan.
  int choose_donor(std::int64_t room, bool last_slot, std::int64_t target, RunRule rule) const {
    const int num_donors = static_cast<int>(donors_.size());
    if (num_donors == 0 || run_of(donors_[0], target) <= 0) return -1;
    if (rule == RunRule::largest) return 0;
    // First position whose run is below `room`: runs before it fill the room.
    int low = 0, high = num_donors;
    while (low < high) {
      const int middle = (low + high) / 2;
      if (run_of(donors_[middle], target) >= room)
        low = middle + 1;
      else
        high = middle;
    }
    // A donor's whole remaining excess in one run that fits: it is done. Not
    // in the receiver's last slot, where only a run that fills the room
    // avoids leaving it short. Looked for among the kFinishingLookahead
    // largest runs that fit, so a slot costs O(log D), not O(D), when no
    // donor finishes.
    const int finishing_end = last_slot ? low : std::min(num_donors, low + kFinishingLookahead);
    for (int i = low; i < finishing_end; ++i) {
      const int d = donors_[i];
      const std::int64_t run = run_of(d, target);
      if (run <= 0) break;
      if (run == loads_[d] - target) return i;
    }
    if (low == 0) return 0;  // nothing fills the room: the largest
    // The smallest run that fills the room (the first of its ties): keeps
    // larger runs whole for emptier receivers.
    int fill = low - 1;
    while (fill > 0 && run_of(donors_[fill - 1], target) == run_of(donors_[fill], target)) --fill;
    return fill;
  }

  void reset() {
    loads_ = home_loads_;
    std::copy(counts_.begin(), counts_.end(), home_quota_.begin());
    std::fill(used_slots_.begin(), used_slots_.end(), 0);
    std::fill(slot_experts_.begin(), slot_experts_.end(), kEmptySlot);
    std::fill(slot_quota_.begin(), slot_quota_.end(), 0);
    // give_run keeps each rank's experts ordered by remaining quota, so the
    // first is always the donor's largest.
    experts_by_home_ = experts_by_count_;
  }

  // Moves `run` tokens of the donor's largest remaining expert into a new
  // slot of `receiver`. A receiver takes each expert at most once in a fill
  // (after its run either the receiver is full or the donor's excess or the
  // expert's quota is spent), so no expert lands twice on a rank.
  void give_run(int donor, int receiver, std::int64_t run) {
    int* const first = experts_by_home_.data() + home_offsets_[donor];
    int* const last = experts_by_home_.data() + home_offsets_[donor + 1];
    const int expert = *first;
    const int slot = receiver * num_slots_ + used_slots_[receiver]++;
    EPMOE_DCHECK(homes_[expert] != receiver);
    slot_experts_[slot] = expert;
    slot_quota_[slot] = run;
    home_quota_[expert] -= run;
    loads_[donor] -= run;
    loads_[receiver] += run;
    // Keep the donor's experts ordered by remaining quota: sink the one that
    // gave (E_l is small).
    for (int* at = first; at + 1 < last; ++at) {
      const int next = at[1];
      if (home_quota_[next] < home_quota_[*at] || (home_quota_[next] == home_quota_[*at] && next > *at)) break;
      std::swap(at[0], at[1]);
    }
  }

  std::span<const std::int64_t> counts_;
  std::span<const int> homes_;
  ReplicaCosts costs_;
  std::span<const std::int64_t> source_counts_;  // [R * E] or empty
  std::span<const int> previous_slots_;          // [R * B] or empty
  int num_experts_, num_ranks_, num_slots_;

  // Fixed for the step.
  std::vector<std::int64_t> home_loads_;  // [R]
  std::vector<int> home_offsets_;         // [R + 1] experts_by_home_ ranges
  std::vector<int> experts_by_count_;     // [E] by home, each rank's by count, largest first

  // One fill's plan.
  std::vector<std::int64_t> loads_;       // [R]
  std::vector<std::int64_t> home_quota_;  // [E]
  std::vector<int> used_slots_;           // [R] slots are filled in index order
  std::vector<int> slot_experts_;         // [R * B]
  std::vector<std::int64_t> slot_quota_;  // [R * B]
  std::vector<int> experts_by_home_;      // [E] as experts_by_count_, by remaining home quota
  std::vector<int> donors_;               // ranks above the target
  std::vector<int> ranks_by_home_load_;   // [R] emptiest home first: receivers

  // Costs (enabled only): scratch [4 * R]; per rank its tokens' pairs and
  // those computed at home with no replicas; the busiest link's rows then.
  std::vector<std::int64_t> per_rank_, source_pairs_, home_local_;
  std::vector<std::int64_t> rows_in_, rows_out_, scratch_;  // [R] rows without replicas; [3 * R]
  // [R] each rank's rows in and out under the last link_rows_after().
  std::vector<double> rows_in_after_, rows_out_after_;
  std::int64_t home_link_rows_ = 0;
  // [E] the link_rows_after() call that last counted each expert's home.
  std::vector<int> evaluated_;
  int evaluation_ = 0;
  bool price_runs_ = false;
  int unpaid_runs_ = 0;
};

void check_planner_inputs(std::span<const std::int64_t> expert_counts, std::span<const int> home_rank_of_expert,
                          const ReplicaPlannerOptions& options) {
  EPMOE_CHECK_GT(options.num_ranks, 0);
  EPMOE_CHECK_GE(options.num_redundant_slots_per_rank, 0);
  EPMOE_CHECK_GT(options.rebalance_threshold, 0.0);
  EPMOE_CHECK_GT(expert_counts.size(), 0u);
  EPMOE_CHECK_EQ(expert_counts.size(), home_rank_of_expert.size());
  std::int64_t total = 0;
  for (std::size_t e = 0; e < expert_counts.size(); ++e) {
    EPMOE_CHECK_GE(expert_counts[e], 0);
    EPMOE_CHECK(home_rank_of_expert[e] >= 0 && home_rank_of_expert[e] < options.num_ranks);
    // Loads are summed and multiplied by R in int64 (within()): keep headroom.
    EPMOE_CHECK_LE(expert_counts[e], std::numeric_limits<std::int64_t>::max() / 4 / options.num_ranks - total);
    total += expert_counts[e];
  }
}

// The largest max load that meets the threshold, never below the ideal.
std::int64_t target_max_load(const LoadImbalance& homes, double threshold) {
  const std::int64_t ideal = homes.ideal_max_load();
  if (homes.total_load == 0) return 0;  // within() holds for any max: nothing to aim at
  // The homes meet it: nothing moves. Always so from threshold = R up (to
  // infinity), since no rank carries more than the total (max/mean <= R);
  // and it keeps the estimate below in range: threshold * total / R < max.
  if (homes.within(threshold)) return homes.max_load;
  auto target = static_cast<std::int64_t>(threshold * static_cast<double>(homes.total_load) / homes.num_ranks);
  // Settle on the integer that within() accepts and its successor does not,
  // so the target and the stop test agree exactly. The estimate is off by
  // the rounding of one product at most, so each walk takes a few steps.
  const auto meets = [&](std::int64_t max_load) {
    return LoadImbalance{max_load, homes.total_load, homes.num_ranks}.within(threshold);
  };
  target = std::clamp(target, ideal, homes.max_load);
  while (target > ideal && !meets(target)) --target;
  while (target < homes.max_load && meets(target + 1)) ++target;
  return target;
}

}  // namespace

std::vector<int> contiguous_home_ranks(int num_experts, int num_ranks) {
  EPMOE_CHECK_GT(num_ranks, 0);
  EPMOE_CHECK_EQ(num_experts % num_ranks, 0);
  const int experts_per_rank = num_experts / num_ranks;
  std::vector<int> homes(num_experts);
  for (int e = 0; e < num_experts; ++e) homes[e] = e / experts_per_rank;
  return homes;
}

ReplicaPlan plan_replicas(std::span<const std::int64_t> expert_counts, std::span<const int> home_rank_of_expert,
                          const ReplicaPlannerOptions& options, std::span<const int> previous_slot_experts,
                          const ReplicaCosts& costs) {
  check_planner_inputs(expert_counts, home_rank_of_expert, options);
  if (!costs.source_pairs.empty())
    EPMOE_CHECK_EQ(costs.source_pairs.size(), static_cast<std::size_t>(options.num_ranks));
  if (!costs.source_rows.empty()) {
    EPMOE_CHECK_EQ(costs.source_rows.size(), static_cast<std::size_t>(options.num_ranks) * options.num_ranks);
  }
  if (!costs.source_counts.empty()) {
    EPMOE_CHECK_EQ(costs.source_counts.size(), expert_counts.size() * static_cast<std::size_t>(options.num_ranks));
  }
  WaterFill fill(expert_counts, home_rank_of_expert, options, previous_slot_experts, costs);
  const LoadImbalance homes = measure_load_imbalance(fill.home_loads());
  const std::int64_t target = target_max_load(homes, options.rebalance_threshold);
  if (homes.max_load <= target || options.num_redundant_slots_per_rank == 0) {
    fill.fill(homes.max_load, RunRule::largest);  // nothing moves
    return fill.finish();
  }
  // One attempt at a target: each rule in turn until one reaches it; the
  // lowest load reached and the rule that reached it.
  struct Attempt {
    std::int64_t reached;
    RunRule rule;
  };
  constexpr RunRule kRules[] = {RunRule::finish_or_fill, RunRule::largest};
  RunRule last_rule = kRules[0];
  std::int64_t last_target = -1;
  const auto attempt = [&](std::int64_t at, std::span<const RunRule> rules) {
    Attempt best{std::numeric_limits<std::int64_t>::max(), rules[0]};
    for (const RunRule rule : rules) {
      const std::int64_t reached = fill.fill(at, rule);
      last_rule = rule;
      last_target = at;
      if (reached < best.reached) best = {reached, rule};
      if (reached <= at) break;
    }
    return best;
  };
  Attempt best = attempt(target, kRules);
  std::int64_t best_target = target;
  if (best.reached > target) {
    // Bisection between the target (not reached) and the best load reached so
    // far. A fill that misses its target still leaves a valid plan, so `best`
    // is always a load some fill reached; a greedy fill is not monotone in
    // its target, so the plan is rebuilt from that fill's target and rule.
    std::int64_t low = target;
    const RunRule first_rule = best.rule;
    const std::int64_t resolution = std::max<std::int64_t>(1, homes.total_load / homes.num_ranks / 512);
    while (best.reached - low > resolution) {
      const std::int64_t middle = low + (best.reached - low) / 2;
      // Only the rule that came closest at the target: half the cost.
      const Attempt at_middle = attempt(middle, std::span<const RunRule>(&first_rule, 1));
      if (at_middle.reached > middle) low = middle;
      if (at_middle.reached < best.reached) {
        best = at_middle;
        best_target = middle;
      }
    }
  }
  if (last_target != best_target || last_rule != best.rule) fill.fill(best_target, best.rule);
  if (!costs.enabled()) return fill.finish();

  // Cost-aware: the balance plan (what the threshold asks, whatever it
  // costs) against plans that refuse the runs that do not pay for their slot,
  // aimed at the balance target and at 1/3 and 2/3 of the way back to the
  // homes' max load, and with B > 1 at the balance target with one slot per
  // rank (fewer replicas on a hot home's port: with B = 2 the balance plan
  // can put two of its experts' weights on each receiver and pay more than
  // it saves where one each pays: many tokens per expert, packed, h200,
  // docs/BENCHMARKS.md "Priced replicas" 2026-12-07); and no replicas (net
  // 0). Each candidate is one fill and one pricing, O(E + R * B), so the
  // search keeps the plan within microseconds.
  const WaterFill::Value balanced = fill.evaluate();
  const bool balance_plan_pays = fill.unpaid_runs() == 0;
  WaterFill::Saved chosen_plan;
  fill.save(chosen_plan);
  struct Candidate {
    std::int64_t target;
    RunRule rule;
    int slot_limit;   // 0: B
    bool price_runs;  // refuse the runs that do not pay for their slot
  };
  constexpr int kFractions = 3;
  std::array<Candidate, kFractions + 1> candidates;
  int num_candidates = 0;
  // The first fraction is skipped when every run of the balance plan pays
  // (pricing would not change it).
  for (int j = balance_plan_pays ? 1 : 0; j < kFractions; ++j) {
    const std::int64_t at = j == 0 ? best_target : best.reached + (homes.max_load - best.reached) * j / kFractions;
    if (at >= homes.max_load) break;
    candidates[num_candidates++] = {at, j == 0 ? best.rule : RunRule::finish_or_fill, 0, true};
  }
  if (options.num_redundant_slots_per_rank > 1) {
    // Every run kept, as in the balance plan (a run that does not pay for
    // its slot alone may pay with the token rows it moves).
    candidates[num_candidates++] = {best_target, best.rule, 1, false};
  }
  WaterFill::Value chosen = balanced;
  int chosen_index = -1;  // -1: the balance plan
  for (int i = 0; i < num_candidates; ++i) {
    fill.price_runs(candidates[i].price_runs);
    fill.fill(candidates[i].target, candidates[i].rule, candidates[i].slot_limit);
    const WaterFill::Value value = fill.evaluate();
    if (value.net() > chosen.net()) {
      chosen = value;
      chosen_index = i;
      if (i + 1 < num_candidates) fill.save(chosen_plan);  // the last fill stays in place
    }
  }
  const bool places = chosen.net() > 0;
  if (!places) {
    chosen = {};
    fill.fill(homes.max_load, RunRule::largest);  // nothing moves: no donors, one pass
  } else if (chosen_index != num_candidates - 1) {
    fill.restore(chosen_plan);
  }
  ReplicaPlan plan = fill.finish();
  plan.predicted_saving_seconds = chosen.saving;
  plan.predicted_cost_seconds = chosen.cost;
  if (chosen_index >= 0 || !places) {  // not the balance plan: what it would have added
    plan.refused_replicas = balanced.replicas - chosen.replicas;
    plan.refused_saving_seconds = balanced.saving - chosen.saving;
    plan.refused_cost_seconds = balanced.cost - chosen.cost;
  }
  return plan;
}

}  // namespace epmoe::balance
