// The mpi transport's launcher, mirroring threads/launcher.h: one process per
// rank under `mpirun -np R`.
//
// MpiScope holds MPI_Init_thread / MPI_Finalize (one RAII scope per process,
// as gloo's mpi/context.cc). It asks for MPI_THREAD_MULTIPLE because comm/
// progresses collectives on worker threads while the rank's own thread may
// post messages too; it fails with ConfigError if the library offers less.
//
// run_rank(argc, argv, fn): opens the scope, runs fn on a communicator over
// all processes and returns 0. If fn throws, the message is printed as
// "epmoe: rank r: rank r failed: <what>" on stderr and the job ends with
// MPI_Abort, so every rank fails with it instead of waiting for the failed
// one. The text is the root error: a collective whose algorithm fails aborts
// the job from its progress thread with its own error first (comm/
// collective_handle.h), and collectives abandoned by the unwinding exception
// are cancelled without printing anything (Communicator::cancel_pending).
#pragma once

#include <functional>

#include "transport/communicator.h"

namespace epmoe::transport::mpi {

class MpiScope {
 public:
  MpiScope(int* argc, char*** argv);
  ~MpiScope();  // MPI_Finalize; never throws
  MpiScope(const MpiScope&) = delete;
  MpiScope& operator=(const MpiScope&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

 private:
  int world_rank_ = 0;
  int world_size_ = 1;
};

int run_rank(int argc, char** argv, const std::function<void(Communicator&)>& fn);

}  // namespace epmoe::transport::mpi
