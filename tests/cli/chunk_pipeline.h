// The forward of a chunked layer in modelled time, for either dispatcher,
// written from the model's own rules (docs/MODELLED_TIME.md, transport/
// threads/emulated_links.h, transport/threads/virtual_timeline.h) rather
// than measured from a one-chunk run, so it holds whether communication
// hides under compute or not.
//
// Valid for the case the tests build: full_mesh links (one link per ordered
// pair, so a rank's messages to different peers never meet) and routing
// that is symmetric over ranks (every rank sends each peer the same bytes in
// every chunk and computes the same), so every rank and every link direction
// follows the same timeline, and one link stands for all: what a rank
// receives from a peer arrives when its own message of the same kind, sent
// on its own link, does. The ring's two lanes mirror each other (equal
// halves, their own links), so its clockwise lane stands for both.
//
// The rules. Every rank and every collective in flight runs on a clock of
// its own, forked from its launcher's at launch; compute adds its charged
// duration; a wait takes max(clock, completion) - a receive completes at the
// message's arrival, a send when its last byte left; waiting for a
// collective takes the waiter to its end. A message takes its link from
// max(entry, link free) for bytes / bandwidth and arrives one latency after
// its last byte left; a link serves messages first come, first served, in
// the order of (entry time, the launch number of the collective that sent
// it, its number in the collective).
//
// The programs (ep/dispatch_handle.cc, moe/moe_layer.cc, and per
// collective comm/all_to_all_v.cc, comm/ring.cc):
//   all-to-all: route; encode chunk 0; launch its exchange D_0
//     per chunk c: wait D_c; gather its rows; [encode chunk c+1; launch
//                  D_{c+1}]; experts; launch the combine K_c
//     per chunk c: wait K_c; sum its rows home
//   D_c sends an 8-byte count to each peer, waits for the peers' counts (by
//   symmetry: when its own arrives), then sends the payload; it ends when
//   the peers' payloads arrived. K_c knows its counts: one message.
//   ring: route; launch the token-count exchange N (one 8-byte message to
//     each peer, posted at once); encode chunk 0; wait N; launch the
//     all-gather G_0
//     per chunk c: wait G_c; gather its rows; [encode chunk c+1; launch
//                  G_{c+1}]; experts; launch the reduce-scatter S_c
//     per chunk c: wait S_c; copy its rows home
//   G_c (per lane): step 0 sends this rank's half-block at launch; step s
//   forwards what arrived at step s-1 as soon as it arrived; it ends when
//   its R-1 receives arrived and its sends left. S_c (both lanes on one
//   clock): sends its first partial sum at launch; per step waits for the
//   partial sum from the neighbour, adds its own (not charged), waits for
//   its previous send to leave and sends the sum on; the last step's sum is
//   its own block's.
//
// Compute durations are the charged operations' own (their sums per stage
// and chunk, read from the trace by name and order, never by time).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace epmoe::testing {

// Seconds of charged compute per stage of one rank's forward.
struct ChunkStages {
  double route = 0;                                       // before chunk 0's encode
  std::vector<double> encode, gather, experts, home_sum;  // per chunk
};

// Rank r's forward compute events (cat "compute", ending by
// `forward_seconds`: the backward's first one starts there), assigned to
// stages by name and order: the c-th "token encode" packs chunk c; "gather
// rows" (and "token decode") open chunk c's receive side, and everything
// after it up to the next one is chunk c's experts; the c-th `home_name`
// ("combine home sum" for the all-to-all, "unpack rows" for the ring)
// brings chunk c home.
inline ChunkStages chunk_stages(const nlohmann::json& events, int r, double forward_seconds, int num_chunks,
                                const std::string& home_name) {
  std::vector<std::pair<double, const nlohmann::json*>> forward;
  for (const nlohmann::json& e : events) {
    if (e.value("cat", "") != "compute" || e.at("pid").get<int>() != r || e.at("ph") != "X") continue;
    const double ts = e.at("ts").get<double>() * 1e-6, end = ts + e.at("dur").get<double>() * 1e-6;
    if (end <= forward_seconds + 1e-13) forward.emplace_back(ts, &e);  // 0.1 ps: times print in whole ps
  }
  std::stable_sort(forward.begin(), forward.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  ChunkStages s;
  const auto n = static_cast<std::size_t>(num_chunks);
  s.encode.assign(n, 0);
  s.gather.assign(n, 0);
  s.experts.assign(n, 0);
  s.home_sum.assign(n, 0);
  std::size_t encodes = 0, gathers = 0, homes = 0;
  for (const auto& [ts, e] : forward) {
    const std::string name = e->at("name").get<std::string>();
    const double dur = e->at("dur").get<double>() * 1e-6;
    if (name == "token encode") {
      s.encode.at(encodes++) += dur;
    } else if (name == "gather rows") {
      s.gather.at(gathers++) += dur;
    } else if (name == "token decode") {
      s.gather.at(gathers - 1) += dur;
    } else if (name == home_name) {
      s.home_sum.at(homes++) += dur;
    } else if (encodes == 0) {
      s.route += dur;
    } else {
      s.experts.at(gathers - 1) += dur;
    }
  }
  EXPECT_EQ(encodes, n);
  EXPECT_EQ(gathers, n);
  EXPECT_EQ(homes, n);
  return s;
}

struct ChunkLinks {
  double bytes_per_second = 0, latency_seconds = 0;
  // Per link and chunk. All-to-all: the forward's token message to a peer
  // (routing words + rows) and the combine's rows back. Ring: one lane's
  // piece of a block - the all-gather's (routing words + rows) and the
  // reduce-scatter's (partial sums) - and the number of ranks.
  double token_bytes = 0, combine_bytes = 0;
  int num_ranks = 0;
};

// A discrete-event run of the processes above - the rank's program and one
// per collective it launches, each on its own clock - whose messages share
// one link direction. Messages are taken in the link's order; a message
// taken can only lead to messages that enter later (latency > 0), and every
// process is run as far as it can before each, so the earliest pending
// message is always the next on the link.
class LinkSchedule {
 public:
  enum class Op { compute, send, wait_arrival, wait_sent, launch, join };
  struct Step {
    Op op;
    double value = 0;  // compute: seconds; send: bytes
    int id = 0;        // send, wait_*: the message; launch, join: the process
  };
  explicit LinkSchedule(const ChunkLinks& links) : links_(links), processes_(1) {}

  int new_message() {
    arrival_.push_back(kUnknown);
    sent_.push_back(kUnknown);
    return static_cast<int>(arrival_.size()) - 1;
  }
  // A collective's program; it starts when a `launch` step names it.
  int new_process(std::vector<Step> steps) {
    processes_.push_back({std::move(steps)});
    return static_cast<int>(processes_.size()) - 1;
  }

  // Runs the rank's program from time 0; returns its end.
  double run(std::vector<Step> rank_program) {
    processes_.at(0).steps = std::move(rank_program);
    processes_.at(0).started = true;
    advance_all();
    while (!pending_.empty()) {
      const auto first = std::min_element(pending_.begin(), pending_.end(), [](const Message& a, const Message& b) {
        return std::tie(a.entry, a.launch, a.number) < std::tie(b.entry, b.launch, b.number);
      });
      const Message m = *first;
      pending_.erase(first);
      link_free_ = std::max(m.entry, link_free_) + m.bytes / links_.bytes_per_second;
      sent_.at(m.id) = link_free_;
      arrival_.at(m.id) = link_free_ + links_.latency_seconds;
      advance_all();
    }
    for (const Process& p : processes_)
      EXPECT_TRUE(!p.started || p.next == p.steps.size()) << "a process waits on something that never ends";
    return processes_.at(0).clock;
  }

 private:
  static constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();
  struct Process {
    std::vector<Step> steps;
    std::size_t next = 0;
    bool started = false;
    double clock = 0;
    int launch = 0, messages = 0;  // its launch number; messages it sent
  };
  struct Message {
    double entry, bytes;
    int launch, number, id;
  };

  // Runs process p until it waits on a time not known yet; true if it moved.
  bool advance(int p) {
    Process& me = processes_[p];
    const std::size_t start = me.next;
    for (; me.next < me.steps.size(); ++me.next) {
      const Step& s = me.steps[me.next];
      if (s.op == Op::compute) {
        me.clock += s.value;
      } else if (s.op == Op::send) {
        pending_.push_back({me.clock, s.value, me.launch, me.messages++, s.id});
      } else if (s.op == Op::launch) {
        Process& child = processes_.at(s.id);
        child.started = true;
        child.clock = me.clock;
        child.launch = ++launches_;
      } else {
        const double until = s.op == Op::wait_arrival ? arrival_.at(s.id)
                             : s.op == Op::wait_sent  ? sent_.at(s.id)
                                                      : end_of(s.id);
        if (std::isnan(until)) break;
        me.clock = std::max(me.clock, until);
      }
    }
    return me.next != start;
  }
  double end_of(int p) const {
    const Process& other = processes_.at(p);
    return other.started && other.next == other.steps.size() ? other.clock : kUnknown;
  }
  void advance_all() {
    for (bool moved = true; moved;) {
      moved = false;
      for (std::size_t p = 0; p < processes_.size(); ++p)
        if (processes_[p].started) moved = advance(static_cast<int>(p)) || moved;
    }
  }

  ChunkLinks links_;
  std::vector<Process> processes_;
  std::vector<double> arrival_, sent_;
  std::vector<Message> pending_;
  double link_free_ = -std::numeric_limits<double>::infinity();
  int launches_ = 0;
};

using Op = LinkSchedule::Op;

// The part of a rank's forward program both dispatchers share, after chunk
// 0's exchange was launched: per chunk, wait for its exchange, gather its
// rows, pack and launch the next chunk's, compute, launch its combine; then
// bring every chunk home.
inline void append_chunks(const ChunkStages& s, const std::vector<int>& exchange, const std::vector<int>& combine,
                          std::vector<LinkSchedule::Step>& rank) {
  const int n = static_cast<int>(s.encode.size());
  for (int c = 0; c < n; ++c) {
    rank.push_back({Op::join, 0, exchange[c]});
    rank.push_back({Op::compute, s.gather[c]});
    if (c + 1 < n) {
      rank.push_back({Op::compute, s.encode[c + 1]});
      rank.push_back({Op::launch, 0, exchange[c + 1]});
    }
    rank.push_back({Op::compute, s.experts[c]});
    rank.push_back({Op::launch, 0, combine[c]});
  }
  for (int c = 0; c < n; ++c) {
    rank.push_back({Op::join, 0, combine[c]});
    rank.push_back({Op::compute, s.home_sum[c]});
  }
}

// The all-to-all's forward makespan (the program above).
inline double alltoall_chunked_forward(const ChunkStages& s, const ChunkLinks& links) {
  const int n = static_cast<int>(s.encode.size());
  LinkSchedule schedule(links);
  std::vector<int> dispatch(n), combine(n);
  for (int c = 0; c < n; ++c) {
    const int count = schedule.new_message(), payload = schedule.new_message(), rows = schedule.new_message();
    dispatch[c] = schedule.new_process({{Op::send, 8, count},
                                        {Op::wait_arrival, 0, count},
                                        {Op::send, links.token_bytes, payload},
                                        {Op::wait_arrival, 0, payload}});
    combine[c] = schedule.new_process({{Op::send, links.combine_bytes, rows}, {Op::wait_arrival, 0, rows}});
  }
  std::vector<LinkSchedule::Step> rank = {{Op::compute, s.route + s.encode[0]}, {Op::launch, 0, dispatch[0]}};
  append_chunks(s, dispatch, combine, rank);
  return schedule.run(std::move(rank));
}

// The ring's forward makespan (the program above).
inline double ring_chunked_forward(const ChunkStages& s, const ChunkLinks& links) {
  const int n = static_cast<int>(s.encode.size()), steps = links.num_ranks - 1;
  LinkSchedule schedule(links);
  const int count = schedule.new_message();
  const int counts =
      schedule.new_process({{Op::send, 8, count}, {Op::wait_arrival, 0, count}, {Op::wait_sent, 0, count}});
  std::vector<int> gather(n), reduce(n);
  for (int c = 0; c < n; ++c) {
    std::vector<int> g(steps), r(steps);
    for (int i = 0; i < steps; ++i) {
      g[i] = schedule.new_message();
      r[i] = schedule.new_message();
    }
    // The all-gather's lane: step s forwards what step s-1 brought.
    std::vector<LinkSchedule::Step> lane = {{Op::send, links.token_bytes, g[0]}};
    for (int i = 1; i < steps; ++i) {
      lane.push_back({Op::wait_arrival, 0, g[i - 1]});
      lane.push_back({Op::send, links.token_bytes, g[i]});
    }
    for (int i = 0; i < steps; ++i) lane.push_back({Op::wait_arrival, 0, g[i]});
    for (int i = 0; i < steps; ++i) lane.push_back({Op::wait_sent, 0, g[i]});
    gather[c] = schedule.new_process(std::move(lane));
    // The reduce-scatter: the partial sum received at step s is sent on at
    // step s+1, once the previous send left.
    std::vector<LinkSchedule::Step> sums = {{Op::send, links.combine_bytes, r[0]}};
    for (int i = 0; i < steps; ++i) {
      sums.push_back({Op::wait_arrival, 0, r[i]});
      if (i + 1 == steps) break;
      sums.push_back({Op::wait_sent, 0, r[i]});
      sums.push_back({Op::send, links.combine_bytes, r[i + 1]});
    }
    sums.push_back({Op::wait_sent, 0, r[steps - 1]});
    reduce[c] = schedule.new_process(std::move(sums));
  }
  std::vector<LinkSchedule::Step> rank = {{Op::compute, s.route},
                                          {Op::launch, 0, counts},
                                          {Op::compute, s.encode[0]},
                                          {Op::join, 0, counts},
                                          {Op::launch, 0, gather[0]}};
  append_chunks(s, gather, reduce, rank);
  return schedule.run(std::move(rank));
}

}  // namespace epmoe::testing
