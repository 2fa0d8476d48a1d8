// An epmoe::Communicator (<epmoe/communicator.h>) over the processes of the
// caller's MPI communicator: one rank per process, ranks and size those of
// `comm`. The only public header that includes <mpi.h>; a program without
// MPI never includes it. Available when epmoe was built with MPI (the
// installed package then finds MPI for its users: find_package(epmoe)).
//
//   MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // or mpi4py
//   {
//     std::unique_ptr<epmoe::Communicator> comm = epmoe::make_mpi_communicator(MPI_COMM_WORLD);
//     ...  // an EP group, collectives, on *comm
//   }  // before MPI_Finalize
//   MPI_Finalize();
//
// Requirements (ConfigError saying what was found and what to do, otherwise):
// MPI initialised, not finalised, with MPI_THREAD_MULTIPLE, because epmoe's
// collectives post messages from progress threads; `comm` an
// intra-communicator (not MPI_COMM_NULL). Every process of `comm` calls
// make_mpi_communicator (it duplicates `comm`, a collective call), and
// destroys the result before MPI_Finalize.
//
// epmoe's messages travel on a duplicate of `comm` (MPI_Comm_dup), so they
// never meet the caller's own messages on `comm`, whatever their tags; the
// caller may free `comm` while the communicator lives. Errors name ranks of
// `comm`. abort() prints the reason on stderr and calls MPI_Abort on the
// duplicate, which ends the whole job (OpenMPI ends every process).
#pragma once

#include <mpi.h>

#include <memory>

#include <epmoe/communicator.h>

namespace epmoe {

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

}  // namespace epmoe
