// A layer on one rank holding every expert, for the single-rank tests: the
// layer and the single-rank EP group it runs on, made together (the group
// first: a base-from-member, so the layer is a MoeLayer and the tests call it
// as one).
#pragma once

#include <epmoe/ep_group.h>
#include <epmoe/moe_layer.h>

namespace epmoe::testing {

struct SingleRankGroup {
  SingleRankGroup(const MoeLayerConfig& config, MemoryLedger* ledger, int num_chunks)
      : group(EpConfig{.num_experts = config.router.num_experts,
                       .top_k = config.router.top_k,
                       .hidden = config.hidden,
                       .num_chunks = num_chunks},
              ledger) {}
  EpGroup group;
};

class SingleRankLayer : private SingleRankGroup, public MoeLayer {
 public:
  explicit SingleRankLayer(const MoeLayerConfig& config, MemoryLedger* ledger = nullptr, int num_chunks = 1)
      : SingleRankGroup(config, ledger, num_chunks), MoeLayer(config, group, ledger) {}
};

}  // namespace epmoe::testing
