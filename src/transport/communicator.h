// The transport interface every collective in comm/ is written against: the
// public epmoe::Communicator (include/epmoe/communicator.h, which documents
// the matching rule and the errors), named inside the transport layer as
// transport::Communicator, plus the transport's own bookkeeping helpers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <epmoe/communicator.h>

#include "core/error.h"

namespace epmoe::transport {

using epmoe::AbortedError;
using epmoe::Clock;
using epmoe::Communicator;
using epmoe::Deadline;
using epmoe::kMaxTag;
using epmoe::Request;
using epmoe::SentBytes;
using epmoe::Tag;

// Bytes the calling thread has posted in sends, over its lifetime (both
// transports count them in isend): a collective's bytes are the growth of
// its progress thread's count while it ran, for the trace.
std::int64_t this_thread_bytes_sent();
void count_bytes_sent(std::int64_t num_bytes);

// "rank 2: <what> peer 3, tag 0x1234" - the common prefix of transport errors.
std::string describe_wait(int rank, std::string_view what, int peer, Tag tag);

}  // namespace epmoe::transport
