// ReplicaStats (public: <epmoe/step_stats.h>): what a ReplicaExchange
// (ep/replica_exchange.h) measured over its last step. The exchange owns and
// resets it; readers get it through the layer's statistics, which hold an
// all-default ReplicaStats when replicas are off.
#pragma once

#include <epmoe/step_stats.h>

namespace epmoe::ep {

using epmoe::ReplicaStats;

}  // namespace epmoe::ep
