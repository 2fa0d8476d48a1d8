// The keys of the EP group's configuration (EpConfig, public in
// <epmoe/config.h>): their parsers.
#pragma once

#include <string_view>

#include <epmoe/config.h>

namespace epmoe::ep {

// DispatchKind, TokenFormat, WireDType, CotangentAllGather, BalanceMode, ReplicaChoice
// and EpConfig itself: <epmoe/config.h>. Here: their keys' parsers.
DispatchKind parse_dispatch_kind(std::string_view key, std::string_view value);
TokenFormat parse_token_format(std::string_view key, std::string_view value);
// f32, bf16, or auto: bf16 when the layer computes in bf16, else f32.
WireDType parse_wire_dtype(std::string_view key, std::string_view value, ComputeDType compute_dtype);
CotangentAllGather parse_cotangent_all_gather(std::string_view key, std::string_view value);
BalanceMode parse_balance_mode(std::string_view key, std::string_view value);
ReplicaChoice parse_replica_choice(std::string_view key, std::string_view value);
ReplicaPlanning parse_replica_planning(std::string_view key, std::string_view value);

}  // namespace epmoe::ep
