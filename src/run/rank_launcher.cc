#include "run/rank_launcher.h"

#include "core/error.h"
#include "core/threading.h"
#include "run/run_faults.h"
#include "transport/threads/launcher.h"
#ifdef EPMOE_WITH_MPI_TRANSPORT
#include "transport/mpi/launcher.h"
#endif

namespace epmoe::run {

void launch_ranks(const ExpertParallelSettings& settings,
                  const std::function<void(transport::Communicator&)>& rank_body) {
  // Each rank works in the run's fault scope (run/run_faults.h).
  const auto scoped_body = [&](transport::Communicator& comm) {
    const RankFaultScope faults(settings.faults, &comm, settings.ep.timeout);
    rank_body(comm);
  };
  if (settings.transport == TransportKind::threads) {
    try {
      transport::threads::run_ranks(settings.num_ranks,
                                    {.links = settings.links,
                                     .compute_threads_per_rank = settings.compute_threads_per_rank,
                                     .modelled = settings.modelled,
                                     .trace = settings.trace},
                                    scoped_body);
    } catch (...) {
      if (settings.faults == nullptr) throw;
      settings.faults->rethrow_naming_stopped_rank(std::current_exception());
    }
    return;
  }
#ifdef EPMOE_WITH_MPI_TRANSPORT
  transport::mpi::run_rank(0, nullptr, [&](transport::Communicator& comm) {
    set_compute_threads(settings.compute_threads_per_rank);
    scoped_body(comm);
  });
#else
  throw InternalError("transport=mpi reached a build without the mpi transport (validated earlier)");
#endif
}

}  // namespace epmoe::run
