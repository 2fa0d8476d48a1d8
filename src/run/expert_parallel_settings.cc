#include "run/expert_parallel_settings.h"

namespace epmoe::run {

std::string to_string(TransportKind kind) { return kind == TransportKind::mpi ? "mpi" : "threads"; }

bool ExpertParallelSettings::single_rank_local() const {
  // token_chunks is not in the list: LocalDispatcher chunks the step too.
  return num_ranks == 1 && transport == TransportKind::threads && !modelled.enabled && trace == nullptr &&
         dispatch == DispatchKind::alltoall && !ep.dedup && ep.capacity_factor == 0 &&
         ep.token_format == TokenFormat::f32 && !ep.replicas_enabled();
}

}  // namespace epmoe::run
