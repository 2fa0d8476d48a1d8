// A timeline of a run in the Chrome trace event format (the JSON object form,
// {"traceEvents": [...]}), which Perfetto UI and chrome://tracing open.
//
// One process (pid) per rank; per rank a "compute" track for the rank
// thread's phases and compute operations (complete events, ph "X", nested by
// scope), and collective tracks: each collective is a complete event on the
// first "collectives k" lane free at its start (lanes are assigned when the
// file is written, so concurrent collectives never overlap on one track),
// and each message it sent an async event (ph "b"/"e") with its bytes, peer
// and hops in args. Times are microseconds: modelled time in clock=modelled,
// else wall time since the recorder was made.
//
// Cost: an event is a few words appended under one mutex; a 500-step
// training run at 4 ranks records about 10^6 events (tens of MB of JSON).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/timer.h"

namespace epmoe {

using TraceArgs = std::vector<std::pair<const char*, double>>;  // keys are literals

class TraceRecorder {
 public:
  TraceRecorder() = default;

  // Thread-safe. A complete event on (pid, the rank's compute track).
  void add_compute(int pid, std::string name, const char* category, double begin_us, double end_us,
                   TraceArgs args = {});
  // A collective (laid out on lanes at write()) and the messages it sent.
  void add_collective(int pid, std::string name, double begin_us, double end_us, TraceArgs args = {});
  void add_message(int pid, std::string name, double begin_us, double end_us, TraceArgs args = {});

  double wall_now_us() const { return origin_.elapsed_seconds() * 1e6; }
  std::size_t num_events() const;

  // Writes the JSON to `path` atomically (a temporary file renamed into
  // place); FileError naming the path when it cannot, leaving nothing.
  void write(const std::string& path) const;
  // Drops every event and restarts the wall clock: the next run's timeline
  // alone (a WholeWorldLayer traces each call). Not while events are added.
  void clear();

 private:
  enum class Kind { compute, collective, message };
  struct Event {
    Kind kind;
    int pid;
    std::string name;
    const char* category;
    double begin_us, end_us;
    TraceArgs args;
  };
  void add(Event event);

  Stopwatch origin_;
  mutable std::mutex mutex_;  // guards events_
  std::vector<Event> events_;
};

// The recorder and rank the calling thread's events go to (nullptr: none).
struct TraceTrack {
  TraceRecorder* recorder = nullptr;
  int pid = 0;
};
TraceTrack this_thread_trace_track();
TraceTrack set_this_thread_trace_track(TraceTrack track);  // returns the previous one

// Records nothing of the calling thread (nor of what it launches) while in
// scope: set-up that is not part of the timeline a trace shows.
class UntracedScope {
 public:
  UntracedScope() : previous_(set_this_thread_trace_track({})) {}
  ~UntracedScope() { set_this_thread_trace_track(previous_); }
  UntracedScope(const UntracedScope&) = delete;
  UntracedScope& operator=(const UntracedScope&) = delete;

 private:
  TraceTrack previous_;
};

// The calling thread's clock in microseconds: modelled when it has a modelled
// clock, else wall time of its trace recorder (0 with neither).
double this_thread_trace_now_us();

// Records the scope as a complete event on the calling thread's track (no
// cost without one). `name` and `category` must outlive the scope.
class TraceSpan {
 public:
  explicit TraceSpan(const char* name, const char* category = "phase");
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* name_;
  const char* category_;
  TraceTrack track_;
  double begin_us_ = 0;
};

}  // namespace epmoe
