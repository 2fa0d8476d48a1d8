// The public MPI factory (<epmoe/mpi_communicator.h>) on a communicator that
// is not MPI_COMM_WORLD, under
//   mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 comm_mpi_split_test
// MPI_COMM_WORLD is split into two halves, world ranks {0, 1} and {2, 3},
// ordered by descending world rank, so that a half's rank differs from its
// world rank: half 0 is (rank 0 = world 1, rank 1 = world 0), half 1 is
// (rank 0 = world 3, rank 1 = world 2). Each process makes an epmoe
// communicator from its half; both halves run the same collectives with the
// same tags at the same time. Checked: each half gathers its own processes'
// data; every collective of comm/ against its naive reference, ours and
// MPI's; the caller's messages on the half never meet epmoe's; a timed-out
// wait names the late rank by its rank in the half; an inter-communicator
// between the halves, and MPI_COMM_NULL, are refused.
// With --abort-in-half-1, rank 1 of half 1 aborts its communicator while the
// other half waits in an MPI_Barrier on MPI_COMM_WORLD: MPI_Abort on the
// half's duplicate must end the whole job (ctest: the message, no timeout).
#include <gtest/gtest.h>

#include <epmoe/mpi_communicator.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collective_checks.h"
#include "comm/all_gather.h"
#include "comm/all_reduce.h"
#include "core/error.h"

namespace epmoe::comm {
namespace {

using namespace std::chrono_literals;

int g_world_rank = -1;
int g_half = -1;  // 0 or 1
MPI_Comm g_half_comm = MPI_COMM_NULL;
transport::Communicator* g_comm = nullptr;

TEST(MpiSplitCommunicator, RanksAndSizeAreTheHalfs) {
  ASSERT_EQ(g_comm->size(), 2);
  int half_rank = -1;
  MPI_Comm_rank(g_half_comm, &half_rank);
  EXPECT_EQ(g_comm->rank(), half_rank);
  EXPECT_EQ(g_comm->rank(), g_half * 2 + 1 - g_world_rank) << "descending world rank within the half";
  EXPECT_EQ(g_comm->transport_name(), "mpi");
}

TEST(MpiSplitCommunicator, EachHalfGathersItsOwnProcessesData) {
  // Half h's rank 0 is world 2h + 1, its rank 1 world 2h.
  const std::vector<float> expected_blocks = {static_cast<float>(2 * g_half + 1), static_cast<float>(2 * g_half)};
  for (Algorithm algorithm : {Algorithm::ring, Algorithm::native}) {
    constexpr std::int64_t kPerRank = 1000;
    std::vector<float> input(kPerRank, static_cast<float>(g_world_rank));
    std::vector<float> output(2 * kPerRank, -1.0f);
    ring_all_gather(*g_comm, {.input = input.data(),
                              .output = output.data(),
                              .num_elements_per_rank = kPerRank,
                              .algorithm = algorithm,
                              .tag = 40})
        .wait();
    for (int block = 0; block < 2; ++block) {
      for (std::int64_t i = 0; i < kPerRank; ++i) {
        ASSERT_EQ(output[block * kPerRank + i], expected_blocks[block])
            << "half " << g_half << " block " << block << " element " << i << " algorithm "
            << (algorithm == Algorithm::ring ? "ring" : "native");
      }
    }
  }
}

TEST(MpiSplitCommunicator, EveryCollectiveMatchesTheNaiveReference) {
  testing::check_everything(*g_comm, Algorithm::ring);
  testing::check_everything(*g_comm, Algorithm::native);
}

TEST(MpiSplitCommunicator, TheCallersMessagesOnTheHalfNeverMeetEpmoes) {
  // Same peer, same tag, the caller's message sent first: were epmoe's
  // messages on the caller's communicator, its receive would match 111.
  constexpr int kTag = 5;
  if (g_comm->rank() == 0) {
    const int callers = 111, epmoes = 222;
    MPI_Send(&callers, 1, MPI_INT, 1, kTag, g_half_comm);
    g_comm->isend(1, kTag, &epmoes, sizeof(epmoes))->wait(30s);
  } else {
    int epmoes = 0, callers = 0;
    g_comm->irecv(0, kTag, &epmoes, sizeof(epmoes))->wait(30s);
    MPI_Recv(&callers, 1, MPI_INT, 0, kTag, g_half_comm, MPI_STATUS_IGNORE);
    EXPECT_EQ(epmoes, 222);
    EXPECT_EQ(callers, 111);
  }
}

TEST(MpiSplitCommunicator, ATimeoutNamesTheLateRankByItsRankInTheHalf) {
  // Rank 0 of each half stops rank 1's process (world 2h) and waits for a
  // message from it: the liveness probe, on the half's duplicate, must name
  // "rank 1" - world rank 0 or 2 would mean it probed the world. Rank 0
  // resumes rank 1 afterwards.
  int pid = getpid();
  std::vector<int> pids(2);
  MPI_Allgather(&pid, 1, MPI_INT, pids.data(), 1, MPI_INT, g_half_comm);
  if (g_comm->rank() == 0) {
    ASSERT_EQ(kill(pids[1], SIGSTOP), 0);
    int value = 0;
    auto recv = g_comm->irecv(1, 77, &value, sizeof(value));
    std::string message;
    try {
      recv->wait(300ms);
    } catch (const PeerError& e) {
      message = e.what();
    }
    kill(pids[1], SIGCONT);
    EXPECT_EQ(message.rfind("rank 0: timed out after ", 0), 0u) << message;
    EXPECT_NE(message.find("waiting to receive from peer 1, tag 77; rank 1 did not answer a liveness probe within "
                           "500 ms: it is the late rank (stopped or hung)"),
              std::string::npos)
        << message;
  }
  MPI_Barrier(g_half_comm);
}

// On the processes that do not print gtest's report: their failures, named
// by world rank (a failed check on rank 0 of half 1 is on world rank 3).
class FailurePrinter : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "world rank %d: %s:%d: Failure\n%s\n", g_world_rank, result.file_name(), result.line_number(),
                 result.summary());
  }
};

TEST(MpiSplitCommunicator, AnInterCommunicatorIsRefused) {
  // Each half's rank 0 leads; half h's leader is world 2h + 1.
  const int remote_leader = g_half == 0 ? 3 : 1;
  MPI_Comm inter = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Intercomm_create(g_half_comm, 0, MPI_COMM_WORLD, remote_leader, 61, &inter), MPI_SUCCESS);
  try {
    make_mpi_communicator(inter);
    ADD_FAILURE() << "an inter-communicator was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("mpi transport: the communicator is an inter-communicator", 0), 0u)
        << e.what();
  }
  MPI_Comm_free(&inter);
}

TEST(MpiSplitCommunicator, MpiCommNullIsRefused) { EXPECT_THROW(make_mpi_communicator(MPI_COMM_NULL), ConfigError); }

}  // namespace
}  // namespace epmoe::comm

int main(int argc, char** argv) {
  bool abort_in_half_1 = false;
  for (int i = 1; i < argc; ++i) abort_in_half_1 = abort_in_half_1 || std::strcmp(argv[i], "--abort-in-half-1") == 0;
  ::testing::InitGoogleTest(&argc, argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &epmoe::comm::g_world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size != 4) {
    if (epmoe::comm::g_world_rank == 0) std::fprintf(stderr, "comm_mpi_split_test: run with mpirun -np 4\n");
    MPI_Finalize();
    return 2;
  }
  const int world_rank = epmoe::comm::g_world_rank;
  epmoe::comm::g_half = world_rank / 2;
  MPI_Comm_split(MPI_COMM_WORLD, epmoe::comm::g_half, /*key=*/-world_rank, &epmoe::comm::g_half_comm);
  int status = 0;
  {
    std::unique_ptr<epmoe::Communicator> comm = epmoe::make_mpi_communicator(epmoe::comm::g_half_comm);
    if (abort_in_half_1) {
      if (epmoe::comm::g_half == 1 && comm->rank() == 1) comm->abort("rank 1 failed: injected abort in half 1");
      MPI_Barrier(MPI_COMM_WORLD);  // never completes: the aborting process does not get here
      std::fprintf(stderr, "world rank %d passed a barrier the aborted job should never complete\n", world_rank);
      return 3;
    }
    if (world_rank != 0) {  // one process prints the gtest report, the others their failures
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new epmoe::comm::FailurePrinter);
    }
    epmoe::comm::g_comm = comm.get();
    status = RUN_ALL_TESTS();
    epmoe::comm::g_comm = nullptr;
  }
  // A failure on any process fails the job.
  int worst = status;
  MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Comm_free(&epmoe::comm::g_half_comm);
  MPI_Finalize();
  return worst;
}
