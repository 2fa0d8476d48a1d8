// The mpi transport: one process per rank, point-to-point messages over
// OpenMPI (MPI_Isend / MPI_Irecv) on a private duplicate of a communicator
// the caller gives (MPI_COMM_WORLD under run_rank, or any communicator of
// the caller's through <epmoe/mpi_communicator.h>), so our tags never meet
// the caller's or another library's messages. Ranks are that
// communicator's: every message names them. Mirrors threads/communicator.h.
//
// Requirements, checked at construction (ConfigError saying what was found
// and what to do): MPI initialised and not finalised, with
// MPI_THREAD_MULTIPLE, because comm/ posts messages from its progress
// threads while the rank's own thread may post too; an intra-communicator. Every process of the
// communicator constructs it (MPI_Comm_dup is collective), and destroys it
// before MPI_Finalize (its liveness helper calls MPI until then).
//
// Waits poll MPI_Test (OpenMPI makes progress inside MPI calls only): a short
// spin, then sleeps doubling up to 1 ms (communicator.cc), so that ranks
// oversubscribing the cores (R > cores under mpirun) do not starve each other
// by spinning, and a rank waiting for a late peer costs next to nothing.
// A wait that times out names the late rank found by a liveness probe
// (mpi/liveness.h, on a second duplicate of the same communicator): "...;
// rank 2 did not answer a liveness probe within 500 ms: it is the late rank
// (stopped or hung)".
// cancel_pending fails this process's waits at their next poll.
// Messages above 1 GiB are split into several MPI messages with the same tag
// (MPI counts are int; ours are 64-bit); non-overtaking keeps them in order.
#pragma once

#include <mpi.h>

#include <memory>

#include "transport/communicator.h"
#include "transport/native_collectives.h"

namespace epmoe::transport::mpi {

class MpiNativeCollectives;

class MpiCommunicator final : public Communicator {
 public:
  // A communicator over the processes of `comm` (not owned; the caller may
  // free it at once: this works on its own duplicates).
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;  // MPI_Comm_free; never throws
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view transport_name() const override { return "mpi"; }
  std::unique_ptr<Request> isend(int peer, Tag tag, const void* data, std::int64_t num_bytes) override;
  std::unique_ptr<Request> irecv(int peer, Tag tag, void* data, std::int64_t num_bytes) override;
  // Prints the reason and calls MPI_Abort on this communicator's duplicate,
  // which ends the job (OpenMPI ends every process of the job, not only the
  // communicator's): does not return. First caller wins; a second one
  // blocks until the process ends.
  void abort(const std::string& reason, std::exception_ptr cause = nullptr) override;
  void cancel_pending(const std::string& reason) override;
  NativeCollectives* native_collectives() override;

  struct RankState;  // shared with this communicator's requests (communicator.cc)

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;     // the messages'
  MPI_Comm control_ = MPI_COMM_NULL;  // the liveness probe's, apart from every data tag
  std::unique_ptr<RankState> state_;
  std::unique_ptr<MpiNativeCollectives> native_;
  int rank_ = 0;
  int size_ = 1;
};

// "MPI_THREAD_SERIALIZED" for MPI_THREAD_SERIALIZED, etc.
std::string mpi_thread_level_name(int level);

}  // namespace epmoe::transport::mpi
