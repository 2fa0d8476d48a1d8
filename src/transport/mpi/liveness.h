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
// measures the gaps between its polls (2 ms apart when it runs) and keeps the
// recent long ones; a ping says how long the timed-out wait lasted, and the
// answer carries the longest gap that ended within that time before the ping
// was found (a gap that ended before the wait began is not the wait's cause;
// one that spans it, a stop the prober's ping ended, counts whole). A rank
// whose answer reports kStalledGap or more was stopped (or starved) while the
// other waited: it is named late too.
//
// A starved machine: a host that stops scheduling all of the job's processes
// for hundreds of ms (a loaded 2-core machine running 4 ranks did, once in
// ~200 runs) makes every rank report a stall, the waiting one included. So
// the waiting rank measures its own helper's stall within the same wait, and
// names a rank late only if its stall exceeds that by kStalledGap; the note
// then says that this rank too was not running. Before, such a machine-wide
// stall, remembered for a second, named every rank late.
//
// Messages: ping = an int64 sequence number and the wait's length in
// microseconds (tag kPingTag), answer = the same number back and the stall in
// microseconds (kAnswerTag); an answer with an old number (to a probe that
// already gave up) is dropped.
#pragma once

#include <mpi.h>

#include <array>
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
// Gaps between the helper's polls this long or longer are kept, for as long
// as a wait may last (kGapMemory) and at most kMaxGaps of them.
constexpr std::chrono::milliseconds kRememberedGap{20};
constexpr std::chrono::minutes kGapMemory{10};
constexpr std::size_t kMaxGaps = 256;

// What a probe found about one other rank.
struct ProbeAnswer {
  bool answered = false;
  std::chrono::microseconds stall{0};  // its longest gap not running that ended within the wait (answered only)
  // `own_stall`: the probing rank's own within the same wait (a starved machine).
  bool late(std::chrono::microseconds own_stall) const { return !answered || stall >= own_stall + kStalledGap; }
};

class LivenessProbe {
 public:
  // `control` is owned by the caller and outlives this; starts the helper.
  LivenessProbe(MPI_Comm control, int rank, int size);
  ~LivenessProbe();  // stops and joins the helper; never throws
  LivenessProbe(const LivenessProbe&) = delete;
  LivenessProbe& operator=(const LivenessProbe&) = delete;

  // Every rank's answer within `window` (this rank's: answered, no stall),
  // their stalls within the `waited` before the ping.
  std::vector<ProbeAnswer> probe(std::chrono::milliseconds window, std::chrono::microseconds waited);
  // For a wait on `peer` that timed out after `waited`: "; rank 2 did not
  // answer a liveness probe within 500 ms: it is the late rank (stopped or
  // hung)" (or "answered ... only after not running for 480 ms"), or "" when
  // every rank answered in time (then the peer is alive but never sent: a
  // program error).
  std::string late_rank_note(int peer, std::chrono::microseconds waited);

 private:
  using Clock = std::chrono::steady_clock;
  struct Gap {
    Clock::time_point start, end;
  };
  void serve();
  void remember_gap(Gap gap);
  // The longest gap between this process's helper's polls that ended after `from`.
  std::chrono::microseconds stall_since(Clock::time_point from);

  MPI_Comm control_;
  int rank_;
  int size_;
  std::atomic<bool> stopping_{false};
  std::mutex probe_mutex_;  // one probe at a time; guards next_sequence_
  std::int64_t next_sequence_ = 1;
  std::deque<std::array<std::int64_t, 2>> ping_buffers_;  // guarded by probe_mutex_; a few per timeout, never freed
  // When the helper last polled: the gap it is in now, which no poll has
  // recorded yet (after a stop, the waiting thread may run first).
  std::atomic<Clock::rep> last_poll_{Clock::now().time_since_epoch().count()};
  std::mutex gaps_mutex_;
  std::deque<Gap> gaps_;  // guarded by gaps_mutex_; the helper's recent long gaps, oldest first
  std::thread helper_;    // last: started once the members above exist
};

}  // namespace epmoe::transport::mpi
