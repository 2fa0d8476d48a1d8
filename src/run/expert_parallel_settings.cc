#include "run/expert_parallel_settings.h"

#include "core/error.h"

namespace epmoe::run {

std::string to_string(TransportKind kind) { return kind == TransportKind::mpi ? "mpi" : "threads"; }

bool ExpertParallelSettings::single_rank_local() const {
  // token_chunks is not in the list: LocalDispatcher chunks the step too.
  return num_ranks == 1 && transport == TransportKind::threads && !modelled.enabled && trace == nullptr &&
         ep.dispatch == DispatchKind::alltoall && !ep.dedup && ep.capacity_factor == 0 &&
         ep.token_format == TokenFormat::f32 && !ep.replicas_enabled();
}

std::unique_ptr<EpGroup> ExpertParallelSettings::make_group(transport::Communicator* comm, std::uint32_t tag_base,
                                                            MemoryLedger* ledger) const {
  EpConfig config = ep;
  config.tag_base = tag_base;
  if (single_rank_local()) return std::make_unique<EpGroup>(config, ledger);
  EPMOE_CHECK(comm != nullptr);
  return std::make_unique<EpGroup>(*comm, config, ledger);
}

}  // namespace epmoe::run
