// all_gather_texts: every rank contributes a string of any length (a JSON
// report, a per-step metrics record) and every rank receives all of them in
// rank order. Two ring all-gathers: the lengths, then the texts padded to the
// longest (an all-gather moves equal blocks). Blocking; for small texts
// (reports), not bulk data.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/collective_handle.h"
#include "transport/communicator.h"

namespace epmoe::comm {

// Uses collective tags `tag` and `tag + 1` (comm/tag.h).
std::vector<std::string> all_gather_texts(transport::Communicator& comm, const std::string& own, std::uint32_t tag,
                                          std::chrono::milliseconds timeout = kDefaultTimeout);

}  // namespace epmoe::comm
