#include "core/trace_recorder.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>

#include "core/error.h"
#include "core/modelled_clock.h"

namespace epmoe {
namespace {

thread_local TraceTrack this_thread_track;

constexpr int kComputeTid = 0;
constexpr int kFirstCollectiveTid = 1;

void write_escaped(std::ostream& out, const std::string& text) {
  out << '"';
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out << '\\' << c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
      out << buffer;
    } else {
      out << c;
    }
  }
  out << '"';
}

void write_args(std::ostream& out, const TraceArgs& args) {
  out << ",\"args\":{";
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (i > 0) out << ',';
    write_escaped(out, args[i].first);
    out << ':' << args[i].second;
  }
  out << '}';
}

void write_metadata(std::ostream& out, const char* what, int pid, int tid, const std::string& name) {
  out << "{\"name\":\"" << what << "\",\"ph\":\"M\",\"ts\":0,\"pid\":" << pid << ",\"tid\":" << tid
      << ",\"args\":{\"name\":";
  write_escaped(out, name);
  out << "}}";
}

}  // namespace

void TraceRecorder::add(Event event) {
  if (event.end_us < event.begin_us) event.end_us = event.begin_us;  // wall clocks of two threads
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(std::move(event));
}

void TraceRecorder::add_compute(int pid, std::string name, const char* category, double begin_us, double end_us,
                                TraceArgs args) {
  add({Kind::compute, pid, std::move(name), category, begin_us, end_us, std::move(args)});
}

void TraceRecorder::add_collective(int pid, std::string name, double begin_us, double end_us, TraceArgs args) {
  add({Kind::collective, pid, std::move(name), "collective", begin_us, end_us, std::move(args)});
}

void TraceRecorder::add_message(int pid, std::string name, double begin_us, double end_us, TraceArgs args) {
  add({Kind::message, pid, std::move(name), "message", begin_us, end_us, std::move(args)});
}

std::size_t TraceRecorder::num_events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

void TraceRecorder::write(const std::string& path) const {
  std::vector<Event> events;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events = events_;
  }
  // Per rank: compute events sorted by (begin, longest first) so that an
  // enclosing scope precedes what it encloses; collectives on the first lane
  // free at their start. Ties are broken by everything else an event holds,
  // never by the order threads recorded them in: that order is the host's,
  // and with it the lanes and the file would differ between identical
  // modelled runs (issue 30).
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.pid != b.pid) return a.pid < b.pid;
    if (a.begin_us != b.begin_us) return a.begin_us < b.begin_us;
    if (a.end_us != b.end_us) return a.end_us > b.end_us;
    if (a.kind != b.kind) return a.kind < b.kind;
    if (const int c = a.name.compare(b.name); c != 0) return c < 0;
    if (const int c = std::string_view(a.category).compare(b.category); c != 0) return c < 0;
    return std::lexicographical_compare(a.args.begin(), a.args.end(), b.args.begin(), b.args.end(),
                                        [](const auto& x, const auto& y) {
                                          if (const int c = std::string_view(x.first).compare(y.first); c != 0)
                                            return c < 0;
                                          return x.second < y.second;
                                        });
  });
  std::map<int, std::vector<double>> lane_free_at;  // [pid][lane]
  std::map<int, int> pids;                          // pid -> lanes used
  if (std::filesystem::is_directory(path)) throw FileError("trace_file=" + path + ": is a directory; name a file");
  const std::string temporary = path + ".tmp";
  // Whatever fails below, the temporary goes: a failed write leaves nothing.
  struct RemoveUnlessRenamed {
    const std::string& temporary;
    bool renamed = false;
    ~RemoveUnlessRenamed() {
      std::error_code ignored;
      if (!renamed) std::filesystem::remove(temporary, ignored);
    }
  } cleanup{temporary};
  {
    std::ofstream out(temporary);
    if (!out) throw FileError("trace_file=" + path + ": cannot open " + temporary + " for writing");
    out.precision(15);
    out << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
    bool first = true;
    auto separator = [&] {
      if (!first) out << ",\n";
      first = false;
    };
    std::int64_t next_async_id = 1;
    for (const Event& e : events) {
      int tid = kComputeTid;
      if (e.kind == Kind::collective) {
        std::vector<double>& lanes = lane_free_at[e.pid];
        std::size_t lane = 0;
        while (lane < lanes.size() && lanes[lane] > e.begin_us) ++lane;
        if (lane == lanes.size()) lanes.push_back(0);
        lanes[lane] = e.end_us;
        tid = kFirstCollectiveTid + static_cast<int>(lane);
      }
      pids[e.pid] = std::max(pids[e.pid], static_cast<int>(lane_free_at[e.pid].size()));
      separator();
      if (e.kind == Kind::message) {
        const std::int64_t id = next_async_id++;
        for (const char* ph : {"b", "e"}) {
          out << "{\"name\":";
          write_escaped(out, e.name);
          out << ",\"cat\":\"message\",\"ph\":\"" << ph << "\",\"id\":" << id
              << ",\"ts\":" << (ph[0] == 'b' ? e.begin_us : e.end_us) << ",\"pid\":" << e.pid
              << ",\"tid\":" << kFirstCollectiveTid;
          if (ph[0] == 'b') write_args(out, e.args);
          out << '}';
          if (ph[0] == 'b') out << ",\n";
        }
        continue;
      }
      out << "{\"name\":";
      write_escaped(out, e.name);
      out << ",\"cat\":\"" << e.category << "\",\"ph\":\"X\",\"ts\":" << e.begin_us
          << ",\"dur\":" << (e.end_us - e.begin_us) << ",\"pid\":" << e.pid << ",\"tid\":" << tid;
      write_args(out, e.args);
      out << '}';
    }
    for (const auto& [pid, lanes] : pids) {
      separator();
      write_metadata(out, "process_name", pid, kComputeTid, "rank " + std::to_string(pid));
      out << ",\n";
      write_metadata(out, "thread_name", pid, kComputeTid, "compute");
      for (int lane = 0; lane < std::max(lanes, 1); ++lane) {
        out << ",\n";
        write_metadata(out, "thread_name", pid, kFirstCollectiveTid + lane, "collectives " + std::to_string(lane));
      }
    }
    out << "\n]}\n";
    out.flush();
    if (!out) throw FileError("trace_file=" + path + ": writing " + temporary + " failed (disk full?)");
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) throw FileError("trace_file=" + path + ": cannot rename " + temporary + ": " + error.message());
  cleanup.renamed = true;
}

void TraceRecorder::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.clear();
  origin_ = Stopwatch();
}

TraceTrack this_thread_trace_track() { return this_thread_track; }

TraceTrack set_this_thread_trace_track(TraceTrack track) {
  const TraceTrack previous = this_thread_track;
  this_thread_track = track;
  return previous;
}

double this_thread_trace_now_us() {
  if (const ModelledClock* clock = this_thread_modelled_clock()) return static_cast<double>(clock->now()) * 1e-6;
  if (this_thread_track.recorder != nullptr) return this_thread_track.recorder->wall_now_us();
  return 0;
}

TraceSpan::TraceSpan(const char* name, const char* category)
    : name_(name), category_(category), track_(this_thread_trace_track()) {
  if (track_.recorder != nullptr) begin_us_ = this_thread_trace_now_us();
}

TraceSpan::~TraceSpan() {
  if (track_.recorder != nullptr) {
    track_.recorder->add_compute(track_.pid, name_, category_, begin_us_, this_thread_trace_now_us());
  }
}

}  // namespace epmoe
