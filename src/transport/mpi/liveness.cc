#include "transport/mpi/liveness.h"

#include <algorithm>
#include <array>
#include <deque>
#include <sstream>

namespace epmoe::transport::mpi {
namespace {

constexpr int kPingTag = 1;
constexpr int kAnswerTag = 2;
constexpr auto kLivenessFirstSleep = std::chrono::microseconds(50);
constexpr auto kLivenessMaxSleep = std::chrono::microseconds(2000);

void cancel_and_complete(MPI_Request& request) {
  if (request == MPI_REQUEST_NULL) return;
  MPI_Cancel(&request);
  MPI_Wait(&request, MPI_STATUS_IGNORE);
}

}  // namespace

LivenessProbe::LivenessProbe(MPI_Comm control, int rank, int size)
    : control_(control), rank_(rank), size_(size), helper_([this] { serve(); }) {}

LivenessProbe::~LivenessProbe() {
  stopping_.store(true, std::memory_order_release);
  if (helper_.joinable()) helper_.join();
}

void LivenessProbe::remember_gap(Gap gap) {
  const std::lock_guard lock(gaps_mutex_);
  while (!gaps_.empty() && (gaps_.size() >= kMaxGaps || gap.end - gaps_.front().end > kGapMemory)) gaps_.pop_front();
  gaps_.push_back(gap);
}

std::chrono::microseconds LivenessProbe::stall_since(Clock::time_point from) {
  const std::lock_guard lock(gaps_mutex_);
  Clock::duration longest{0};
  for (const Gap& gap : gaps_) {
    if (gap.end > from) longest = std::max(longest, gap.end - gap.start);
  }
  return std::chrono::duration_cast<std::chrono::microseconds>(longest);
}

void LivenessProbe::serve() {
  std::array<std::int64_t, 2> ping{};  // sequence, the wait's length in us
  MPI_Request recv = MPI_REQUEST_NULL;
  MPI_Irecv(ping.data(), 2, MPI_INT64_T, MPI_ANY_SOURCE, kPingTag, control_, &recv);
  std::deque<std::array<std::int64_t, 2>> answers;  // stable addresses, kept until their sends complete
  std::vector<MPI_Request> answer_requests;
  auto sleep = kLivenessFirstSleep;
  auto previous_poll = Clock::now();
  while (!stopping_.load(std::memory_order_acquire)) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Test(&recv, &flag, &status) != MPI_SUCCESS) break;
    // The gap is taken after the test, right before an answer would leave:
    // a stop inside MPI_Test (where this thread spends much of its time when
    // OpenMPI yields the core on an oversubscribed node) is then in the gap
    // the answer carries. Taken before the test, that stop was missed: the
    // rank answered the ping it had found with the gap before its stop, and
    // a rank stopped for 500 ms reported 0.2 ms (1 of ~15 runs of
    // CollectivesMpi.ARankResumedWhileAProbeIsOpenIsStillNamedLate at -np 4).
    const auto now = Clock::now();
    if (now - previous_poll >= kRememberedGap) remember_gap({previous_poll, now});
    previous_poll = now;
    last_poll_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
    if (flag) {
      // Gaps that ended within the wait's length before now: for a running
      // rank the wait itself; for one stopped when the ping came, its stop
      // ended just now and counts whole (liveness.h).
      const std::chrono::microseconds stall = stall_since(now - std::chrono::microseconds(ping[1]));
      answers.push_back({ping[0], static_cast<std::int64_t>(stall.count())});
      answer_requests.push_back(MPI_REQUEST_NULL);
      MPI_Isend(answers.back().data(), 2, MPI_INT64_T, status.MPI_SOURCE, kAnswerTag, control_,
                &answer_requests.back());
      MPI_Irecv(ping.data(), 2, MPI_INT64_T, MPI_ANY_SOURCE, kPingTag, control_, &recv);
      sleep = kLivenessFirstSleep;
      continue;
    }
    if (!answer_requests.empty()) {  // 16-byte sends complete at once (eager); reclaim them
      int all_done = 0;
      MPI_Testall(static_cast<int>(answer_requests.size()), answer_requests.data(), &all_done, MPI_STATUSES_IGNORE);
      if (all_done) {
        answer_requests.clear();
        answers.clear();
      }
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kLivenessMaxSleep);
  }
  cancel_and_complete(recv);
  for (MPI_Request& request : answer_requests) {
    if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
  }
}

std::vector<ProbeAnswer> LivenessProbe::probe(std::chrono::milliseconds window, std::chrono::microseconds waited) {
  std::lock_guard<std::mutex> lock(probe_mutex_);
  const std::int64_t sequence = next_sequence_++;
  std::vector<std::array<std::int64_t, 2>> answer(static_cast<std::size_t>(size_), {0, 0});
  std::vector<MPI_Request> recvs(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  std::vector<MPI_Request> pings(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  std::vector<ProbeAnswer> found(static_cast<std::size_t>(size_));
  found[rank_].answered = true;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Irecv(answer[r].data(), 2, MPI_INT64_T, r, kAnswerTag, control_, &recvs[r]);
    // A ping to a stopped rank may never complete: its buffer outlives the probe.
    MPI_Isend(ping_buffers_.emplace_back(std::array<std::int64_t, 2>{sequence, waited.count()}).data(), 2, MPI_INT64_T,
              r, kPingTag, control_, &pings[r]);
  }
  const auto give_up = std::chrono::steady_clock::now() + window;
  auto sleep = kLivenessFirstSleep;
  while (std::chrono::steady_clock::now() < give_up) {
    bool all = true;
    for (int r = 0; r < size_; ++r) {
      if (found[r].answered) continue;
      int flag = 0;
      MPI_Test(&recvs[r], &flag, MPI_STATUS_IGNORE);
      if (flag && answer[r][0] == sequence) {
        found[r] = {true, std::chrono::microseconds(answer[r][1])};
        continue;
      }
      if (flag) MPI_Irecv(answer[r].data(), 2, MPI_INT64_T, r, kAnswerTag, control_, &recvs[r]);  // a stale answer
      all = false;
    }
    if (all) break;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kLivenessMaxSleep);
  }
  for (int r = 0; r < size_; ++r) {
    cancel_and_complete(recvs[r]);
    if (pings[r] != MPI_REQUEST_NULL) MPI_Request_free(&pings[r]);
  }
  return found;
}

std::string LivenessProbe::late_rank_note(int peer, std::chrono::microseconds waited) {
  (void)peer;  // the late rank is whoever does not answer (or was not running), the peer or not
  const Clock::time_point wait_began = Clock::now() - waited;
  const std::vector<ProbeAnswer> found = probe(kProbeWindow, waited);
  // This rank's own stall within the wait and the probe: a machine that ran
  // none of the job for a while shows in every answer (liveness.h). Its
  // helper may not have polled since this process resumed (the waiting
  // thread ran first, and the others' answers came at once): the gap it is
  // still in counts too.
  const Clock::time_point last_poll{Clock::duration(last_poll_.load(std::memory_order_relaxed))};
  const std::chrono::microseconds own_stall = std::max(
      stall_since(wait_began), std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - last_poll));
  std::ostringstream note;
  if (own_stall >= kStalledGap) {
    note << "; this rank too was not running for "
         << std::chrono::duration_cast<std::chrono::milliseconds>(own_stall).count()
         << " ms during the wait (a starved machine): no rank is named late for a stall shorter than "
         << std::chrono::duration_cast<std::chrono::milliseconds>(own_stall + kStalledGap).count() << " ms";
  }
  int num_late = 0;
  for (int r = 0; r < size_; ++r) {
    const ProbeAnswer& answer = found[static_cast<std::size_t>(r)];
    if (!answer.late(own_stall)) continue;
    ++num_late;
    note << "; rank " << r;
    if (answer.answered) {
      note << " answered a liveness probe only after not running for "
           << std::chrono::duration_cast<std::chrono::milliseconds>(answer.stall).count() << " ms";
    } else {
      note << " did not answer a liveness probe within " << kProbeWindow.count() << " ms";
    }
  }
  if (num_late == 1) note << ": it is the late rank (stopped or hung)";
  if (num_late > 1) note << ": they are late (stopped or hung)";
  return note.str();
}

}  // namespace epmoe::transport::mpi
