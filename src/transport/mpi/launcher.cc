#include "transport/mpi/launcher.h"

#include <mpi.h>

#include <cstdio>
#include <exception>
#include <string>

#include "core/error.h"
#include "transport/mpi/communicator.h"

namespace epmoe::transport::mpi {

MpiScope::MpiScope(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) throw ConfigError("MpiScope: MPI is already initialised (one scope per process)");
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw ConfigError(
        "mpi transport: MPI_THREAD_MULTIPLE required (comm/ progresses collectives "
        "on worker threads), this MPI provides " +
        mpi_thread_level_name(provided));
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
}

MpiScope::~MpiScope() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int run_rank(int argc, char** argv, const std::function<void(Communicator&)>& fn) {
  MpiScope scope(&argc, &argv);
  std::string failure;
  std::exception_ptr cause;
  {
    MpiCommunicator communicator(MPI_COMM_WORLD);
    try {
      fn(communicator);
    } catch (const std::exception& e) {
      failure = e.what();
      cause = std::current_exception();
    } catch (...) {
      failure = "unknown exception";
      cause = std::current_exception();
    }
    if (!failure.empty()) {
      communicator.abort("rank " + std::to_string(scope.world_rank()) + " failed: " + failure, cause);
    }
  }
  return 0;
}

}  // namespace epmoe::transport::mpi
