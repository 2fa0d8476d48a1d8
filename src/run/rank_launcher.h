// Runs a function on every rank of an ExpertParallelSettings: R threads of
// this process (transport=threads, each with its share of the compute
// threads), or this MPI process as one rank (transport=mpi; run_rank() holds
// MPI_Init / MPI_Finalize, and a rank's exception prints "rank r failed: ..."
// and aborts the job). A rank that throws fails every rank; the exception
// reaches the caller.
#pragma once

#include <functional>

#include "run/expert_parallel_settings.h"
#include "transport/communicator.h"

namespace epmoe::run {

void launch_ranks(const ExpertParallelSettings& settings,
                  const std::function<void(transport::Communicator&)>& rank_body);

}  // namespace epmoe::run
