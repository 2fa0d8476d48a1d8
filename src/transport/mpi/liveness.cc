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

void LivenessProbe::serve() {
  std::int64_t ping = 0;
  MPI_Request recv = MPI_REQUEST_NULL;
  MPI_Irecv(&ping, 1, MPI_INT64_T, MPI_ANY_SOURCE, kPingTag, control_, &recv);
  std::deque<std::array<std::int64_t, 2>> answers;  // stable addresses, kept until their sends complete
  std::vector<MPI_Request> answer_requests;
  auto sleep = kLivenessFirstSleep;
  // The longest gap between two polls lately, and when it ended (see liveness.h).
  auto previous_poll = std::chrono::steady_clock::now(), stall_ended = previous_poll;
  std::chrono::microseconds stall{0};
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
    const auto now = std::chrono::steady_clock::now();
    const auto gap = std::chrono::duration_cast<std::chrono::microseconds>(now - previous_poll);
    previous_poll = now;
    if (now - stall_ended > kStallMemory) stall = std::chrono::microseconds{0};
    if (gap >= stall) {
      stall = gap;
      stall_ended = now;
    }
    if (flag) {
      answers.push_back({ping, static_cast<std::int64_t>(stall.count())});
      answer_requests.push_back(MPI_REQUEST_NULL);
      MPI_Isend(answers.back().data(), 2, MPI_INT64_T, status.MPI_SOURCE, kAnswerTag, control_,
                &answer_requests.back());
      MPI_Irecv(&ping, 1, MPI_INT64_T, MPI_ANY_SOURCE, kPingTag, control_, &recv);
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

std::vector<ProbeAnswer> LivenessProbe::probe(std::chrono::milliseconds window) {
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
    MPI_Isend(&ping_buffers_.emplace_back(sequence), 1, MPI_INT64_T, r, kPingTag, control_, &pings[r]);
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

std::string LivenessProbe::late_rank_note(int peer) {
  (void)peer;  // the late rank is whoever does not answer (or was not running), the peer or not
  const std::vector<ProbeAnswer> found = probe(kProbeWindow);
  std::ostringstream note;
  int num_late = 0;
  for (int r = 0; r < size_; ++r) {
    const ProbeAnswer& answer = found[static_cast<std::size_t>(r)];
    if (!answer.late()) continue;
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
