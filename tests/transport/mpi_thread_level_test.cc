// make_mpi_communicator (<epmoe/mpi_communicator.h>) refuses an MPI it cannot
// run on, with a ConfigError saying what it found and what to do: before
// MPI_Init, after MPI_Init_thread with MPI_THREAD_FUNNELED, after
// MPI_Finalize. One process (ctest runs it under mpirun -np 1); the steps
// depend on each other's MPI state, so they are one test in order.
#include <gtest/gtest.h>

#include <epmoe/error.h>
#include <epmoe/mpi_communicator.h>

#include <string>

namespace epmoe {
namespace {

std::string config_error_of_make() {
  try {
    make_mpi_communicator(MPI_COMM_WORLD);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

TEST(MpiThreadLevel, TheFactoryRefusesMpiWithoutThreadMultipleSayingWhatToDo) {
  EXPECT_EQ(config_error_of_make(),
            "mpi transport: MPI is not initialised; call MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, "
            "&provided) first (mpi4py does by default)");

  int provided = -1;
  ASSERT_EQ(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), MPI_SUCCESS);
  ASSERT_EQ(provided, MPI_THREAD_FUNNELED) << "this MPI gave another level than asked: the check below needs FUNNELED";
  EXPECT_EQ(config_error_of_make(),
            "mpi transport: MPI was initialised with MPI_THREAD_FUNNELED; epmoe needs MPI_THREAD_MULTIPLE (its "
            "collectives post messages from progress threads): call MPI_Init_thread(&argc, &argv, "
            "MPI_THREAD_MULTIPLE, &provided) first (mpi4py does by default)");

  MPI_Finalize();
  EXPECT_EQ(config_error_of_make(),
            "mpi transport: MPI is already finalised; make the communicator before MPI_Finalize");
}

}  // namespace
}  // namespace epmoe
