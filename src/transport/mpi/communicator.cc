#include "transport/mpi/communicator.h"

#include <epmoe/mpi_communicator.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"
#include "transport/mpi/liveness.h"
#include "transport/mpi/native_collectives.h"
#include "transport/progress_slot.h"

namespace epmoe::transport::mpi {
namespace {

// Largest piece one MPI message carries (MPI counts are int).
constexpr std::int64_t kMaxMessageBytes = std::int64_t{1} << 30;
// Polling: MPI_Test and yield for the first kSpinTime of a wait (short
// messages complete within it), then sleeps that double from kFirstSleep up
// to kMaxSleep, so that R ranks on 2 cores (mpirun --oversubscribe) leave the
// cores to whoever has work (a rank's compute, overlapped with its
// collective), and a rank waiting for a late peer costs ~1000 wake-ups a
// second instead of the ~0.4 core that fixed 20 us sleeps cost. The sleep is
// at most the time already waited, so a long wait is stretched by < 2x of
// its own length at worst, by <= 1 ms once it is long.
constexpr auto kSpinTime = std::chrono::microseconds(200);
constexpr auto kFirstSleep = std::chrono::microseconds(20);
constexpr auto kMaxSleep = std::chrono::microseconds(1000);

}  // namespace

// What every request of one communicator shares: its failing state
// (cancel_pending) and the liveness probe its timeouts consult.
struct MpiCommunicator::RankState {
  int rank = 0;
  std::atomic<bool> failing{false};
  std::mutex mutex;  // guards failing_reason
  std::string failing_reason;
  std::unique_ptr<LivenessProbe> liveness;

  void throw_if_failing(int peer, Tag tag, bool is_send) {
    if (!failing.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(mutex);
    throw AbortedError(
        describe_wait(rank, is_send ? "cancelled while sending to" : "cancelled while receiving from", peer, tag) +
        ": " + failing_reason);
  }
};

namespace {

class MpiRequest final : public Request {
 public:
  MpiRequest(MpiCommunicator::RankState& state, int peer, Tag tag, bool is_send)
      : state_(state), rank_(state.rank), peer_(peer), tag_(tag), is_send_(is_send), posted_at_(Clock::now()) {}

  ~MpiRequest() override {
    if (complete_) return;
    // Only after a failure: receives are cancelled, sends left to MPI.
    for (MPI_Request& request : pieces_) {
      if (request == MPI_REQUEST_NULL) continue;
      if (!is_send_) MPI_Cancel(&request);
      MPI_Request_free(&request);
    }
  }

  void add_piece(MPI_Request request, std::int64_t num_bytes) {
    pieces_.push_back(request);
    piece_bytes_.push_back(num_bytes);
  }

  bool test() override {
    if (complete_) return true;
    state_.throw_if_failing(peer_, tag_, is_send_);
    int flag = 0;
    std::vector<MPI_Status> statuses(pieces_.size());
    const int rc = MPI_Testall(static_cast<int>(pieces_.size()), pieces_.data(), &flag, statuses.data());
    if (rc != MPI_SUCCESS) fail("MPI_Testall failed");
    if (!flag) return false;
    complete_ = true;
    if (!is_send_) {
      for (std::size_t i = 0; i < pieces_.size(); ++i) {
        int received = 0;
        MPI_Get_count(&statuses[i], MPI_BYTE, &received);
        if (received != piece_bytes_[i]) {
          std::ostringstream what;
          what << "message size mismatch (" << received << " bytes arrived, receive posted for " << piece_bytes_[i]
               << ") from";
          throw PeerError(describe_wait(rank_, what.str(), peer_, tag_));
        }
      }
    }
    return true;
  }

  void wait_until(Deadline deadline) override {
    const Clock::time_point started = Clock::now();
    auto sleep = kFirstSleep;
    for (;;) {
      if (test()) return;
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - posted_at_);
        std::ostringstream what;
        what << "timed out after " << waited.count() << " ms waiting to " << (is_send_ ? "send to" : "receive from");
        throw PeerError(describe_wait(rank_, what.str(), peer_, tag_) +
                        state_.liveness->late_rank_note(
                            peer_, std::chrono::duration_cast<std::chrono::microseconds>(now - posted_at_)));
      }
      // A progress thread whose launcher is lending it a core stops
      // spinning: the lender waits for it to sleep, and a spin would hold
      // both the lent core and the lender for up to kSpinTime.
      ProgressSlot* const slot = this_thread_progress_slot();
      if (now - started < kSpinTime && (slot == nullptr || slot->num_lenders() == 0)) {
        std::this_thread::yield();
      } else {
        const Clock::time_point until = now + std::min<Clock::duration>(sleep, deadline - now);
        // On a progress thread the sleep is parked in its slot, so that the
        // thread that launched the collective can lend it a core when the
        // next poll is due (transport/progress_slot.h) instead of leaving it
        // to the scheduler; MPI has no wait with a timeout to sleep on.
        if (slot != nullptr) {
          slot->poll_sleep(until);
        } else {
          std::this_thread::sleep_until(until);
        }
        sleep = std::min(sleep * 2, kMaxSleep);
      }
    }
  }

  int peer() const override { return peer_; }
  Tag tag() const override { return tag_; }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw PeerError(
        describe_wait(rank_, std::string(what) + (is_send_ ? " sending to" : " receiving from"), peer_, tag_));
  }

  MpiCommunicator::RankState& state_;  // the communicator's; outlives its requests
  int rank_;
  int peer_;
  Tag tag_;
  bool is_send_;
  Clock::time_point posted_at_;
  bool complete_ = false;
  std::vector<MPI_Request> pieces_;
  std::vector<std::int64_t> piece_bytes_;
};

void check_arguments(int rank, int size, int peer, Tag tag, std::int64_t num_bytes, const char* op) {
  std::ostringstream msg;
  if (peer < 0 || peer >= size) {
    msg << op << " on rank " << rank << ": peer " << peer << " outside [0, " << size << ")";
  } else if (tag > kMaxTag) {
    msg << op << " on rank " << rank << ": tag " << tag << " > kMaxTag " << kMaxTag;
  } else if (num_bytes < 0) {
    msg << op << " on rank " << rank << ": num_bytes = " << num_bytes << " < 0";
  } else {
    return;
  }
  throw ConfigError(msg.str());
}

}  // namespace

std::string mpi_thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "thread level " + std::to_string(level);
}

namespace {

// MPI and `comm` as the mpi transport needs them (communicator.h), or a
// ConfigError saying what was found and what to do.
void check_mpi_is_usable(MPI_Comm comm) {
  constexpr const char* kHowToInit =
      "call MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) first (mpi4py does by default)";
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw ConfigError(std::string("mpi transport: MPI is not initialised; ") + kHowToInit);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    throw ConfigError("mpi transport: MPI is already finalised; make the communicator before MPI_Finalize");
  }
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    throw ConfigError(
        "mpi transport: MPI was initialised with " + mpi_thread_level_name(provided) +
        "; epmoe needs MPI_THREAD_MULTIPLE (its collectives post messages from progress threads): " + kHowToInit);
  }
  if (comm == MPI_COMM_NULL) throw ConfigError("mpi transport: the communicator is MPI_COMM_NULL");
  int is_inter = 0;
  MPI_Comm_test_inter(comm, &is_inter);
  if (is_inter) {
    throw ConfigError(
        "mpi transport: the communicator is an inter-communicator; epmoe's ranks exchange among themselves, so it "
        "needs an intra-communicator (MPI_Intercomm_merge makes one)");
  }
  int* tag_upper_bound = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_upper_bound, &found);
  if (found && static_cast<std::int64_t>(*tag_upper_bound) < static_cast<std::int64_t>(kMaxTag)) {
    throw ConfigError("mpi transport: this MPI's MPI_TAG_UB is " + std::to_string(*tag_upper_bound) +
                      ", below the 2^31-1 tags comm/tag.h lays out");
  }
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : state_(std::make_unique<RankState>()) {
  check_mpi_is_usable(comm);
  check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  check_mpi(MPI_Comm_dup(comm, &control_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  native_ = std::make_unique<MpiNativeCollectives>(comm_);
  state_->rank = rank_;
  state_->liveness = std::make_unique<LivenessProbe>(control_, rank_, size_);
}

MpiCommunicator::~MpiCommunicator() {
  state_->liveness.reset();  // joins the helper before its communicator goes
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // the caller broke the rule (communicator.h); MPI_Comm_free would be erroneous
  if (control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::unique_ptr<Request> MpiCommunicator::isend(int peer, Tag tag, const void* data, std::int64_t num_bytes) {
  check_arguments(rank_, size_, peer, tag, num_bytes, "isend");
  count_bytes_sent(num_bytes);
  auto request = std::make_unique<MpiRequest>(*state_, peer, tag, /*is_send=*/true);
  const char* bytes = static_cast<const char*>(data);
  std::int64_t offset = 0;
  do {  // at least one message, also for 0 bytes
    const std::int64_t piece = std::min(kMaxMessageBytes, num_bytes - offset);
    MPI_Request piece_request = MPI_REQUEST_NULL;
    check_mpi(MPI_Isend(bytes + offset, static_cast<int>(piece), MPI_BYTE, peer, static_cast<int>(tag), comm_,
                        &piece_request),
              "MPI_Isend");
    request->add_piece(piece_request, piece);
    offset += piece;
  } while (offset < num_bytes);
  return request;
}

std::unique_ptr<Request> MpiCommunicator::irecv(int peer, Tag tag, void* data, std::int64_t num_bytes) {
  check_arguments(rank_, size_, peer, tag, num_bytes, "irecv");
  auto request = std::make_unique<MpiRequest>(*state_, peer, tag, /*is_send=*/false);
  char* bytes = static_cast<char*>(data);
  std::int64_t offset = 0;
  do {
    const std::int64_t piece = std::min(kMaxMessageBytes, num_bytes - offset);
    MPI_Request piece_request = MPI_REQUEST_NULL;
    check_mpi(MPI_Irecv(bytes + offset, static_cast<int>(piece), MPI_BYTE, peer, static_cast<int>(tag), comm_,
                        &piece_request),
              "MPI_Irecv");
    request->add_piece(piece_request, piece);
    offset += piece;
  } while (offset < num_bytes);
  return request;
}

void MpiCommunicator::abort(const std::string& reason, std::exception_ptr cause) {
  // First reason wins: a second thread that gets here (a progress thread and
  // the launcher at once) waits for the first one's MPI_Abort to end the process.
  static std::atomic<bool> aborting{false};
  if (aborting.exchange(true)) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::fprintf(stderr, "epmoe: rank %d: %s\n", rank_, reason.c_str());
  std::fflush(stderr);
  // The job's exit code is the one the tool gives on one process: 2 for bad
  // input (an epmoe::Error), 1 otherwise (cli/main.cc; core/error.h).
  MPI_Abort(comm_, exit_code_for(cause));
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]]-style control flow honest
}

void MpiCommunicator::cancel_pending(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->failing.load(std::memory_order_relaxed)) return;
    state_->failing_reason = reason;
  }
  state_->failing.store(true, std::memory_order_release);  // waits see it at their next poll (<= 1 ms)
}

NativeCollectives* MpiCommunicator::native_collectives() { return native_.get(); }

}  // namespace epmoe::transport::mpi

namespace epmoe {

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  return std::make_unique<transport::mpi::MpiCommunicator>(comm);
}

}  // namespace epmoe
