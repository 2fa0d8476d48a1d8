// The expert-parallel dispatchers' configuration (EpConfig, public in
// <epmoe/config.h>): the key parsers and the dispatcher factory.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <epmoe/config.h>

#include "ep/dispatcher.h"
#include "transport/communicator.h"

namespace epmoe::ep {

// DispatchKind, TokenFormat, CotangentAllGather, BalanceMode, ReplicaChoice
// and EpConfig itself: <epmoe/config.h>. Here: their keys' parsers.
DispatchKind parse_dispatch_kind(std::string_view key, std::string_view value);
TokenFormat parse_token_format(std::string_view key, std::string_view value);
CotangentAllGather parse_cotangent_all_gather(std::string_view key, std::string_view value);
BalanceMode parse_balance_mode(std::string_view key, std::string_view value);
ReplicaChoice parse_replica_choice(std::string_view key, std::string_view value);
std::unique_ptr<Dispatcher> make_dispatcher(DispatchKind kind, transport::Communicator& comm, const EpConfig& config);

}  // namespace epmoe::ep
