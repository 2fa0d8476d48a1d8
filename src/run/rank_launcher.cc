#include "run/rank_launcher.h"

#include "core/error.h"
#include "core/threading.h"
#include "transport/threads/launcher.h"
#ifdef EPMOE_WITH_MPI_TRANSPORT
#include "transport/mpi/launcher.h"
#endif

namespace epmoe::run {

void launch_ranks(const ExpertParallelSettings& settings,
                  const std::function<void(transport::Communicator&)>& rank_body) {
  if (settings.transport == TransportKind::threads) {
    transport::threads::run_ranks(settings.num_ranks,
                                  {.links = settings.links,
                                   .compute_threads_per_rank = settings.compute_threads_per_rank,
                                   .modelled = settings.modelled,
                                   .trace = settings.trace},
                                  rank_body);
    return;
  }
#ifdef EPMOE_WITH_MPI_TRANSPORT
  transport::mpi::run_rank(0, nullptr, [&](transport::Communicator& comm) {
    set_compute_threads(settings.compute_threads_per_rank);
    rank_body(comm);
  });
#else
  throw InternalError("transport=mpi reached a build without the mpi transport (validated earlier)");
#endif
}

}  // namespace epmoe::run
