// Whether this process was started by an MPI launcher, read from the
// environment the launcher sets, before MPI_Init. `epmoe layer transport=mpi`
// validates the rank count against it together with every other key, so a
// bad setting fails on every process with the same one-line message instead
// of after MPI_Init (where a failure has to abort the whole job).
//
// Variables read (the first one present wins):
//   OpenMPI mpirun:           OMPI_COMM_WORLD_SIZE / _RANK / _LOCAL_SIZE
//   PMIx launchers (srun):    PMIX_RANK with the size in OMPI_* or PMI_SIZE
//   MPICH / Hydra, Intel MPI: PMI_SIZE / PMI_RANK (MPI_LOCALNRANKS)
#pragma once

#include <optional>

namespace epmoe::run {

struct MpiLaunch {
  int world_size = 1;
  int world_rank = 0;
  int local_size = 1;  // processes of this job on this machine (its cores are shared)
};

// nullopt when no launcher variable is set: the process was not started by
// mpirun (MPI would run it as a singleton world of one).
std::optional<MpiLaunch> mpi_launch_from_environment();

// Whether this epmoe was built with the mpi transport (EPMOE_WITH_MPI and MPI found).
bool mpi_transport_built();

}  // namespace epmoe::run
