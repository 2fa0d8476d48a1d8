// The mpi transport: one process per rank, point-to-point messages over
// OpenMPI (MPI_Isend / MPI_Irecv on a private duplicate of MPI_COMM_WORLD, so
// our tags never meet another library's). Mirrors threads/communicator.h.
//
// Waits poll MPI_Test (OpenMPI makes progress inside MPI calls only): a short
// spin, then sleeps doubling up to 1 ms (communicator.cc), so that ranks
// oversubscribing the cores (R > cores under mpirun) do not starve each other
// by spinning, and a rank waiting for a late peer costs next to nothing.
// A wait that times out names the late rank found by a liveness probe
// (mpi/liveness.h): "...; rank 2 did not answer a liveness probe within
// 500 ms: it is the late rank (stopped or hung)".
// cancel_pending fails this process's waits at their next poll.
// Messages above 1 GiB are split into several MPI messages with the same tag
// (MPI counts are int; ours are 64-bit); non-overtaking keeps them in order.
#pragma once

#include <memory>

#include "transport/communicator.h"
#include "transport/native_collectives.h"

namespace epmoe::transport::mpi {

class MpiScope;
class MpiNativeCollectives;

class MpiCommunicator final : public Communicator {
 public:
  // A communicator over every process of the job. `scope` must outlive it.
  explicit MpiCommunicator(const MpiScope& scope);
  ~MpiCommunicator() override;  // MPI_Comm_free; never throws
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view transport_name() const override { return "mpi"; }
  std::unique_ptr<Request> isend(int peer, Tag tag, const void* data, std::int64_t num_bytes) override;
  std::unique_ptr<Request> irecv(int peer, Tag tag, void* data, std::int64_t num_bytes) override;
  // Prints the reason and calls MPI_Abort: does not return.
  // First caller wins; a second one blocks until the process ends.
  void abort(const std::string& reason, std::exception_ptr cause = nullptr) override;
  void cancel_pending(const std::string& reason) override;
  NativeCollectives* native_collectives() override;

  struct RankState;  // shared with this communicator's requests (communicator.cc)

 private:
  struct Handle;  // the MPI_Comms, kept out of this header
  std::unique_ptr<Handle> handle_;
  std::unique_ptr<RankState> state_;
  std::unique_ptr<MpiNativeCollectives> native_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace epmoe::transport::mpi
