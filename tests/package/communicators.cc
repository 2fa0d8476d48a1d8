// The communicator factories as an embedding program sees them: a ring
// exchange on R = 3 threads (<epmoe/threads_world.h>) and, in a package
// built with MPI, on the processes of MPI_COMM_WORLD
// (<epmoe/mpi_communicator.h>; run under mpirun). Prints what it checked and
// exits non-zero on a wrong value or an exception.
#include <epmoe/communicator.h>
#include <epmoe/error.h>
#include <epmoe/threads_world.h>
#ifdef WITH_MPI
#include <epmoe/mpi_communicator.h>
#endif

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>

namespace {

// Rank r sends 100 + r to its right neighbour; true when the left one's arrived.
bool ring_exchange(epmoe::Communicator& comm) {
  using namespace std::chrono_literals;
  const int right = (comm.rank() + 1) % comm.size();
  const int left = (comm.rank() + comm.size() - 1) % comm.size();
  int sent = 100 + comm.rank(), received = -1;
  auto recv = comm.irecv(left, 7, &received, sizeof(received));
  auto send = comm.isend(right, 7, &sent, sizeof(sent));
  send->wait(30s);
  recv->wait(30s);
  return received == 100 + left;
}

}  // namespace

int main(int argc, char** argv) try {
  std::atomic<int> num_right{0};
  epmoe::run_ranks(3, [&](epmoe::Communicator& comm) { num_right += ring_exchange(comm) ? 1 : 0; });
  if (num_right != 3) return std::fprintf(stderr, "FAIL: threads ring: %d of 3 ranks right\n", num_right.load()), 1;
  int status = 0;
#ifdef WITH_MPI
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  {
    const std::unique_ptr<epmoe::Communicator> comm = epmoe::make_mpi_communicator(MPI_COMM_WORLD);
    if (!ring_exchange(*comm)) {
      std::fprintf(stderr, "FAIL: mpi ring on rank %d of %d\n", comm->rank(), comm->size());
      status = 1;
    } else if (comm->rank() == 0) {
      std::printf("PASS: threads ring (3 ranks) and mpi ring (%d processes)\n", comm->size());
    }
  }
  MPI_Finalize();
#else
  std::printf("PASS: threads ring (3 ranks); the package has no MPI\n");
#endif
  return status;
} catch (const std::exception& e) {
  std::fprintf(stderr, "FAIL: %s\n", e.what());
  return 1;
}
