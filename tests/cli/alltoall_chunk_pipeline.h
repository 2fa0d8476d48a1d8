// The forward of a chunked all-to-all layer in modelled time, written from
// the model's own rules (docs/MODELLED_TIME.md, transport/threads/
// emulated_links.h) rather than measured from a one-chunk run, so it holds
// whether communication hides under compute or not.
//
// Valid for the case the tests build: full_mesh links (one link per ordered
// pair, so a rank's messages to different peers never meet) and routing
// that is symmetric over ranks (every rank sends each peer the same bytes in
// every chunk and computes the same), so every rank and every link direction
// follows the same timeline and one link stands for all.
//
// The program of a rank (ep/dispatch_handle.cc, moe/moe_layer.cc):
//   route; encode chunk 0; launch its exchange D_0
//   per chunk c: wait D_c; gather its rows; [encode chunk c+1; launch D_{c+1}];
//                experts; launch the combine K_c
//   per chunk c: wait K_c; sum its rows home
// An exchange D_c (comm/all_to_all_v.cc) sends an 8-byte count to each peer,
// waits for the peers' counts (by symmetry: when its own arrives), then
// sends the payload; it ends when the peers' payloads arrived. The combine
// K_c knows its counts: one message. A message takes its link from
// max(entry, link free) for bytes / bandwidth and arrives one latency after
// its last byte left; a link serves messages first come, first served, in
// the order of (entry time, the launch number of its collective, its number
// in the collective). Waits take max(clock, completion).
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
// `forward_seconds`: the backward's first one starts there), assigned to stages by name and order: the c-th
// "token encode" packs chunk c; "gather rows" (and "token decode") open
// chunk c's receive side, and everything after it up to the next one is
// chunk c's experts; the c-th "combine home sum" sums chunk c home.
inline ChunkStages chunk_stages(const nlohmann::json& events, int r, double forward_seconds, int num_chunks) {
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
    } else if (name == "combine home sum") {
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
  // Per peer and chunk: the forward's token message (routing words + rows)
  // and the combine's rows.
  double token_bytes = 0, combine_bytes = 0;
};

// The rank's forward makespan per the rules above: a discrete-event run of
// one link direction and the rank's program. Messages are taken in the
// link's order; a message taken can only post messages that enter later
// (latency > 0), and the program is run as far as it can before each, so
// the earliest pending message is always the next on the link.
inline double alltoall_chunked_forward(const ChunkStages& s, const ChunkLinks& links) {
  const int n = static_cast<int>(s.encode.size());
  enum Kind { count, payload, combine };
  struct Message {
    double entry;
    int launch, number, chunk;
    Kind kind;
  };
  std::vector<Message> pending;
  const double unknown = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> d_end(n, unknown), k_end(n, unknown);
  double link_free = -std::numeric_limits<double>::infinity();

  // The program as a list of steps, run by `advance` until a wait's end is unknown.
  enum Op { compute, launch_d, wait_d, launch_k, wait_k };
  std::vector<std::pair<Op, double>> program;  // (op, seconds or chunk)
  program.push_back({compute, s.route + s.encode[0]});
  program.push_back({launch_d, 0});
  for (int c = 0; c < n; ++c) {
    program.push_back({wait_d, c});
    program.push_back({compute, s.gather[c]});
    if (c + 1 < n) {
      program.push_back({compute, s.encode[c + 1]});
      program.push_back({launch_d, c + 1});
    }
    program.push_back({compute, s.experts[c]});
    program.push_back({launch_k, c});
  }
  for (int c = 0; c < n; ++c) {
    program.push_back({wait_k, c});
    program.push_back({compute, s.home_sum[c]});
  }
  std::size_t next = 0;
  int launches = 0;
  double clock = 0;
  auto advance = [&] {
    for (; next < program.size(); ++next) {
      const auto [op, value] = program[next];
      const int c = static_cast<int>(value);
      if (op == compute) {
        clock += value;
      } else if (op == launch_d || op == launch_k) {
        pending.push_back({clock, launches++, 0, c, op == launch_d ? count : combine});
      } else {
        const double end = op == wait_d ? d_end[c] : k_end[c];
        if (std::isnan(end)) return;
        clock = std::max(clock, end);
      }
    }
  };
  advance();
  while (!pending.empty()) {
    const auto first = std::min_element(pending.begin(), pending.end(), [](const Message& a, const Message& b) {
      return std::tie(a.entry, a.launch, a.number) < std::tie(b.entry, b.launch, b.number);
    });
    const Message m = *first;
    pending.erase(first);
    const double bytes = m.kind == count ? 8 : m.kind == payload ? links.token_bytes : links.combine_bytes;
    link_free = std::max(m.entry, link_free) + bytes / links.bytes_per_second;
    const double arrival = link_free + links.latency_seconds;
    if (m.kind == count) pending.push_back({arrival, m.launch, 1, m.chunk, payload});
    if (m.kind == payload) d_end[m.chunk] = arrival;
    if (m.kind == combine) k_end[m.chunk] = arrival;
    advance();
  }
  EXPECT_EQ(next, program.size()) << "the program waits on an exchange that never ends";
  return clock;
}

}  // namespace epmoe::testing
