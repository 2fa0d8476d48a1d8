// The modelled clock of the calling thread (clock=modelled, DESIGN.md §4.11).
//
// In modelled time every rank (and every collective in flight on it) runs on
// its own virtual clock, kept by the threads transport's VirtualTimeline
// (transport/threads/virtual_timeline.h), which implements this interface.
// Layers above the transport see only this: compute code states what an
// operation costs (ComputeScope), and report code reads the totals. In wall
// mode the calling thread has no modelled clock (this_thread_modelled_clock()
// is nullptr) and ComputeScope costs two thread_local reads.
//
// Time is integer picoseconds: sums and maxima of integers are exact and
// associative, so a modelled run is bit-identical however the host schedules
// the threads (doubles would be too, given the same order, but the order of
// a max over ranks would then have to be fixed as well).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace epmoe {

using Picoseconds = std::int64_t;
constexpr Picoseconds kPicosecondsPerSecond = 1'000'000'000'000;
constexpr Picoseconds kNeverPicoseconds = INT64_MAX;

inline double to_seconds(Picoseconds t) { return static_cast<double>(t) * 1e-12; }

// The clock's range: INT64_MAX picoseconds, ~9.2e6 s (~106 days). A time or
// duration beyond it cannot be represented (issue 28 N8: link_latency_us=1e15
// wrapped around and reported a 1.09e-8 s step), so every conversion and sum
// on the clock is checked and refuses it with a ConfigError naming `what`
// (e.g. "link latency (link_latency_us)") and the value: the inputs that lead
// there are absurd rates or latencies, never a bug of the caller's program.
constexpr double kMaxModelledSeconds = 9223372.036854775807;

// Rounded to the nearest picosecond; ConfigError naming `what` when beyond
// the clock's range (+inf included). Negative inputs and NaN are a bug.
Picoseconds seconds_to_picoseconds(double seconds, std::string_view what = "a modelled duration");
// a + b (times and durations on the clock); ConfigError naming `what` when
// the sum is beyond the clock's range.
Picoseconds add_picoseconds(Picoseconds a, Picoseconds b, std::string_view what);

// What one compute operation does: what compute_time=modelled turns into time.
struct ComputeWork {
  double flops = 0;  // multiply-adds count 2
  double bytes = 0;  // read + written at least once (memory-bound steps)
};

// Where a rank's modelled time went. compute: charged compute; communication:
// waiting on transfers this rank could not hide; idle: waiting for a slower
// rank to join (a peer posted late, or a collective's peer launched late).
// compute + communication + idle = the clock's advance.
struct ModelledTotals {
  Picoseconds compute = 0;
  Picoseconds communication = 0;
  Picoseconds idle = 0;
};

// One collective this thread launched, as the modelled timeline saw it.
struct ModelledCollective {
  std::string name;             // "all_to_all_v tag 12"
  Picoseconds start = 0;        // launched (the caller's clock)
  Picoseconds end = 0;          // its last message completed
  Picoseconds waited_from = 0;  // the caller began waiting (end when never waited)
  std::int64_t bytes_sent = 0;  // by this rank
  // Exposed: the part of [start, end] the caller spent waiting.
  Picoseconds exposed() const { return end > waited_from ? end - waited_from : 0; }
  Picoseconds duration() const { return end - start; }
};

class ModelledClock {
 public:
  virtual ~ModelledClock() = default;
  virtual Picoseconds now() const = 0;
  // compute_time=measured: charge_compute uses cpu_seconds (times
  // compute_scale); modelled: `work` at the device's rates.
  virtual bool measures_compute() const = 0;
  // Never throws (it runs in ComputeScope's destructor): a duration the clock
  // cannot hold is kept as the clock's error and thrown by its next call
  // that may throw (totals(), or the transport's next wait or send).
  // `name`: the operation, for that error.
  virtual void charge_compute(const ComputeWork& work, double cpu_seconds, const char* name) noexcept = 0;
  // Throws the clock's error (above), if it has one.
  virtual ModelledTotals totals() const = 0;
  // The collectives this thread launched that have been waited for, in
  // launch order, from the `first`-th on.
  virtual std::vector<ModelledCollective> collectives(std::size_t first) const = 0;
  virtual std::size_t num_collectives() const = 0;
};

ModelledClock* this_thread_modelled_clock();
// Installs `clock` for the calling thread (nullptr: wall); returns the previous one.
ModelledClock* set_this_thread_modelled_clock(ModelledClock* clock);

// Communication that is no part of the modelled timeline (the tool's own
// bookkeeping, such as the trainer's per-step exchange of the ranks'
// reports): while in scope the calling thread runs on no modelled clock, and
// its messages, and those of the collectives it launches, move in real time
// only - no modelled time, no link - so they neither delay nor are delayed by
// the modelled work they run beside (issue 30). Both ends of each message
// must be off the timeline. Tracing is separate (core/trace_recorder.h's
// UntracedScope): a modelled trace must not show wall-clock messages.
bool this_thread_off_timeline();
bool set_this_thread_off_timeline(bool off);  // returns the previous value

class OffTimelineScope {
 public:
  OffTimelineScope()
      : previous_clock_(set_this_thread_modelled_clock(nullptr)), previous_off_(set_this_thread_off_timeline(true)) {}
  ~OffTimelineScope() {
    set_this_thread_off_timeline(previous_off_);
    set_this_thread_modelled_clock(previous_clock_);
  }
  OffTimelineScope(const OffTimelineScope&) = delete;
  OffTimelineScope& operator=(const OffTimelineScope&) = delete;

 private:
  ModelledClock* previous_clock_;
  bool previous_off_;
};

// The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), seconds.
double thread_cpu_seconds();

// Charges the enclosed compute to the calling thread's modelled clock (at
// the end of the scope) and records it on the thread's trace track
// (core/trace_recorder.h) when one is set. A scope opened inside another
// (a gemm's bf16 conversion) is traced but not charged: the outer one's
// work includes it. `name` must outlive the scope (a literal).
class ComputeScope {
 public:
  ComputeScope(const char* name, const ComputeWork& work);
  ~ComputeScope();
  ComputeScope(const ComputeScope&) = delete;
  ComputeScope& operator=(const ComputeScope&) = delete;

 private:
  const char* name_;
  ComputeWork work_;
  ModelledClock* clock_;
  bool traced_;
  double cpu_start_ = 0;
  double trace_start_us_ = 0;
};

}  // namespace epmoe
