#include "transport/mpi/liveness.h"

#include <algorithm>
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
  std::deque<std::int64_t> answers;  // stable addresses, kept until their sends complete
  std::vector<MPI_Request> answer_requests;
  auto sleep = kLivenessFirstSleep;
  while (!stopping_.load(std::memory_order_acquire)) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Test(&recv, &flag, &status) != MPI_SUCCESS) break;
    if (flag) {
      answers.push_back(ping);
      answer_requests.push_back(MPI_REQUEST_NULL);
      MPI_Isend(&answers.back(), 1, MPI_INT64_T, status.MPI_SOURCE, kAnswerTag, control_, &answer_requests.back());
      MPI_Irecv(&ping, 1, MPI_INT64_T, MPI_ANY_SOURCE, kPingTag, control_, &recv);
      sleep = kLivenessFirstSleep;
      continue;
    }
    if (!answer_requests.empty()) {  // 8-byte sends complete at once (eager); reclaim them
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

std::vector<int> LivenessProbe::unresponsive(std::chrono::milliseconds window) {
  std::lock_guard<std::mutex> lock(probe_mutex_);
  const std::int64_t sequence = next_sequence_++;
  std::vector<std::int64_t> answer(static_cast<std::size_t>(size_), 0);
  std::vector<MPI_Request> recvs(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  std::vector<MPI_Request> pings(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  std::vector<bool> answered(static_cast<std::size_t>(size_), false);
  answered[rank_] = true;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Irecv(&answer[r], 1, MPI_INT64_T, r, kAnswerTag, control_, &recvs[r]);
    // A ping to a stopped rank may never complete: its buffer outlives the probe.
    MPI_Isend(&ping_buffers_.emplace_back(sequence), 1, MPI_INT64_T, r, kPingTag, control_, &pings[r]);
  }
  const auto give_up = std::chrono::steady_clock::now() + window;
  auto sleep = kLivenessFirstSleep;
  while (std::chrono::steady_clock::now() < give_up) {
    bool all = true;
    for (int r = 0; r < size_; ++r) {
      if (answered[r]) continue;
      int flag = 0;
      MPI_Test(&recvs[r], &flag, MPI_STATUS_IGNORE);
      if (flag && answer[r] == sequence) {
        answered[r] = true;
        continue;
      }
      if (flag) MPI_Irecv(&answer[r], 1, MPI_INT64_T, r, kAnswerTag, control_, &recvs[r]);  // a stale answer
      all = false;
    }
    if (all) break;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kLivenessMaxSleep);
  }
  std::vector<int> late;
  for (int r = 0; r < size_; ++r) {
    if (!answered[r]) late.push_back(r);
    cancel_and_complete(recvs[r]);
    if (pings[r] != MPI_REQUEST_NULL) MPI_Request_free(&pings[r]);
  }
  return late;
}

std::string LivenessProbe::late_rank_note(int peer) {
  (void)peer;  // the late rank is whoever does not answer, the peer or not
  const std::vector<int> late = unresponsive(kProbeWindow);
  if (late.empty()) return "";
  std::ostringstream note;
  note << (late.size() == 1 ? "; rank " : "; ranks ");
  for (std::size_t i = 0; i < late.size(); ++i) note << (i ? ", " : "") << late[i];
  note << (late.size() == 1 ? " did not" : " do not") << " answer a liveness probe within " << kProbeWindow.count()
       << " ms: " << (late.size() == 1 ? "it is the late rank" : "they are late") << " (stopped or hung)";
  return note.str();
}

}  // namespace epmoe::transport::mpi
