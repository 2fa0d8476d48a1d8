// Liveness probe of the mpi transport (internal to transport/mpi/): names the
// rank a timed-out wait is stuck behind. A wait of rank a on peer b that
// passes its deadline says little by itself: in a ring, b is often only the
// neighbour that is waiting, in turn, for the rank that stopped responding
// (SIGSTOP, a hung process, a debugger). So before a timeout is reported, the
// waiting rank pings every other rank on a private control communicator and
// waits up to kProbeWindow for the answers; whoever does not answer, or
// answers only after it was not running, is named as the late rank.
//
// Every rank answers pings on a small helper thread, whatever its other
// threads are doing (computing, waiting in a collective), so "does not answer
// within kProbeWindow" means "this process is not running" rather than "it
// is busy". The helper polls MPI_Test with sleeps growing from 50 us to 2 ms
// while idle (~500 wake-ups a second at most: no measurable CPU), because
// OpenMPI's blocking receive would spin a core.
//
// Not running: when the first rank to time out ends the job (MPI_Abort),
// mpirun sends every process SIGCONT before SIGTERM, so a stopped rank wakes
// up and answers the probes the other ranks still have open - which then
// named nobody, or only their ring neighbour (issue 28). So the helper
// measures the gaps between its polls (2 ms apart when it runs): an answer
// carries the longest gap of the last kStallMemory, and a rank whose answer
// reports a gap of kStalledGap or more was stopped (or starved) while the
// others waited: it is named as late too.
//
// Messages: ping = one int64 sequence number (tag kPingTag), answer = the
// same number back and the stall in microseconds (kAnswerTag); an answer with
// an old number (to a probe that already gave up) is dropped.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace epmoe::transport::mpi {

// Long enough for a helper thread to be scheduled on this loaded 2-core
// machine (answers take well under 10 ms here), short enough to keep a
// timeout report within ~0.5 s of the deadline.
constexpr std::chrono::milliseconds kProbeWindow{500};
// Half the window: far above the helper's 2 ms polls (and the tens of ms a
// loaded machine adds), below what a stopped process shows.
constexpr std::chrono::milliseconds kStalledGap{250};
constexpr std::chrono::milliseconds kStallMemory{1000};

// What a probe found about one other rank.
struct ProbeAnswer {
  bool answered = false;
  std::chrono::microseconds stall{0};  // the longest gap in its helper's polls lately (answered only)
  bool late() const { return !answered || stall >= kStalledGap; }
};

class LivenessProbe {
 public:
  // `control` is owned by the caller and outlives this; starts the helper.
  LivenessProbe(MPI_Comm control, int rank, int size);
  ~LivenessProbe();  // stops and joins the helper; never throws
  LivenessProbe(const LivenessProbe&) = delete;
  LivenessProbe& operator=(const LivenessProbe&) = delete;

  // Every rank's answer within `window` (this rank's: answered, no stall).
  std::vector<ProbeAnswer> probe(std::chrono::milliseconds window);
  // For a timed-out wait on `peer`: "; rank 2 did not answer a liveness probe
  // within 500 ms: it is the late rank (stopped or hung)" (or "answered ...
  // only after not running for 480 ms"), or "" when every rank answered in
  // time (then the peer is alive but never sent: a program error).
  std::string late_rank_note(int peer);

 private:
  void serve();

  MPI_Comm control_;
  int rank_;
  int size_;
  std::atomic<bool> stopping_{false};
  std::mutex probe_mutex_;  // one probe at a time; guards next_sequence_
  std::int64_t next_sequence_ = 1;
  std::deque<std::int64_t> ping_buffers_;  // guarded by probe_mutex_; a few per timeout, never freed
  std::thread helper_;                     // last: started once the members above exist
};

}  // namespace epmoe::transport::mpi
