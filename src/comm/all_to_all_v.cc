#include "comm/all_to_all_v.h"

#include <cstring>
#include <memory>

#include "comm/tag.h"
#include "core/error.h"

namespace epmoe::comm {
namespace {

using transport::Request;

int wrap(int rank, int num_ranks) { return ((rank % num_ranks) + num_ranks) % num_ranks; }

std::vector<std::int64_t> prefix_offsets(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> offsets(counts.size());
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    offsets[i] = offset;
    offset += counts[i];
  }
  return offsets;
}

std::int64_t total_of(const std::vector<std::int64_t>& counts) {
  std::int64_t total = 0;
  for (std::int64_t count : counts) total += count;
  return total;
}

void exchange_pairwise(transport::Communicator& comm, const AllToAllVOptions& options, transport::Deadline deadline) {
  const int num_ranks = comm.size();
  const int rank = comm.rank();
  const auto esize = static_cast<std::int64_t>(dtype_size_bytes(options.dtype));
  // Counts: one 8-byte message per pair, unless the caller knows them.
  std::vector<std::int64_t> counted;
  std::vector<std::int64_t>& recv_counts = options.recv_counts != nullptr ? *options.recv_counts : counted;
  std::vector<std::unique_ptr<Request>> requests;
  if (options.known_recv_counts != nullptr) {
    recv_counts = *options.known_recv_counts;
  } else {
    recv_counts.assign(num_ranks, 0);
    recv_counts[rank] = options.send_counts[rank];
    const transport::Tag counts_tag = make_tag(CollectiveKind::all_to_all_v, options.tag, Slot::counts);
    requests.reserve(2 * num_ranks);
    for (int step = 1; step < num_ranks; ++step) {
      const int from = wrap(rank - step, num_ranks);
      requests.push_back(comm.irecv(from, counts_tag, &recv_counts[from], sizeof(std::int64_t)));
    }
    for (int step = 1; step < num_ranks; ++step) {
      const int to = wrap(rank + step, num_ranks);
      requests.push_back(comm.isend(to, counts_tag, &options.send_counts[to], sizeof(std::int64_t)));
    }
    detail::collective_fault_point(comm);  // the counts are in flight
    for (auto& request : requests) request->wait_until(deadline);
    requests.clear();
    for (int peer = 0; peer < num_ranks; ++peer) {
      if (recv_counts[peer] < 0) {
        throw PeerError("rank " + std::to_string(rank) + ": peer " + std::to_string(peer) +
                        " announced a negative count " + std::to_string(recv_counts[peer]));
      }
    }
  }

  // Payload, sized exactly.
  const std::vector<std::int64_t> send_offsets = prefix_offsets(options.send_counts);
  const std::vector<std::int64_t> recv_offsets = prefix_offsets(recv_counts);
  std::byte* output = static_cast<std::byte*>(options.recv_buffer);
  if (options.output != nullptr) {
    options.output->resize(static_cast<std::size_t>(total_of(recv_counts) * esize));
    output = options.output->data();
  }
  const auto* input = static_cast<const std::byte*>(options.input);
  const transport::Tag data_tag = make_tag(CollectiveKind::all_to_all_v, options.tag, Slot::data);
  for (int step = 1; step < num_ranks; ++step) {
    const int from = wrap(rank - step, num_ranks);
    if (recv_counts[from] == 0) continue;
    requests.push_back(comm.irecv(from, data_tag, output + recv_offsets[from] * esize, recv_counts[from] * esize));
  }
  for (int step = 1; step < num_ranks; ++step) {
    const int to = wrap(rank + step, num_ranks);
    if (options.send_counts[to] == 0) continue;
    requests.push_back(comm.isend(to, data_tag, input + send_offsets[to] * esize, options.send_counts[to] * esize));
  }
  if (recv_counts[rank] > 0) {
    std::memcpy(output + recv_offsets[rank] * esize, input + send_offsets[rank] * esize,
                static_cast<std::size_t>(recv_counts[rank] * esize));
  }
  // With known counts the fault point comes here: the payload is the first
  // thing in flight.
  if (options.known_recv_counts != nullptr) detail::collective_fault_point(comm);
  for (auto& request : requests) request->wait_until(deadline);
}

void exchange_native(transport::NativeCollectives& native, int num_ranks, const AllToAllVOptions& options) {
  const auto esize = static_cast<std::int64_t>(dtype_size_bytes(options.dtype));
  std::vector<std::int64_t> counted;
  std::vector<std::int64_t>& recv_counts = options.recv_counts != nullptr ? *options.recv_counts : counted;
  if (options.known_recv_counts != nullptr) {
    recv_counts = *options.known_recv_counts;
  } else {
    recv_counts.assign(num_ranks, 0);
    native.all_to_all_counts(options.send_counts, recv_counts);
  }
  void* output = options.recv_buffer;
  if (options.output != nullptr) {
    options.output->resize(static_cast<std::size_t>(total_of(recv_counts) * esize));
    output = options.output->data();
  }
  std::vector<std::int64_t> send_bytes(num_ranks);
  std::vector<std::int64_t> recv_bytes(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    send_bytes[r] = options.send_counts[r] * esize;
    recv_bytes[r] = recv_counts[r] * esize;
  }
  native.all_to_all_v(options.input, send_bytes, output, recv_bytes);
}

}  // namespace

void AllToAllVOptions::validate(const transport::Communicator& comm) const {
  constexpr const char* kName = "all_to_all_v";
  detail::check_common(kName, tag, timeout);
  if (static_cast<int>(send_counts.size()) != comm.size()) {
    throw ConfigError(std::string(kName) + ": send_counts has " + std::to_string(send_counts.size()) +
                      " entries: must have one per rank (" + std::to_string(comm.size()) + ")");
  }
  for (std::int64_t count : send_counts) detail::check_count(kName, "send_counts[r]", count);
  detail::check_buffer(kName, "input", input,
                       total_of(send_counts) * static_cast<std::int64_t>(dtype_size_bytes(dtype)));
  if (known_recv_counts != nullptr) {
    if (static_cast<int>(known_recv_counts->size()) != comm.size()) {
      throw ConfigError(std::string(kName) + ": known_recv_counts has " + std::to_string(known_recv_counts->size()) +
                        " entries: must have one per rank (" + std::to_string(comm.size()) + ")");
    }
    for (std::int64_t count : *known_recv_counts) detail::check_count(kName, "known_recv_counts[r]", count);
    if ((*known_recv_counts)[comm.rank()] != send_counts[comm.rank()]) {
      throw ConfigError(std::string(kName) + ": known_recv_counts[" + std::to_string(comm.rank()) +
                        "] = " + std::to_string((*known_recv_counts)[comm.rank()]) + " but this rank sends itself " +
                        std::to_string(send_counts[comm.rank()]) + ": they must agree");
    }
  }
  if (recv_buffer != nullptr && known_recv_counts == nullptr) {
    throw ConfigError(std::string(kName) +
                      ": recv_buffer needs known_recv_counts (its size must be known before the exchange)");
  }
  if (recv_buffer != nullptr && output != nullptr) {
    throw ConfigError(std::string(kName) + ": pass output or recv_buffer, not both");
  }
  if (output == nullptr) {
    if (known_recv_counts == nullptr) {
      throw ConfigError(std::string(kName) +
                        ": output must point to a vector (or pass recv_buffer with known_recv_counts)");
    }
    detail::check_buffer(kName, "recv_buffer", recv_buffer,
                         total_of(*known_recv_counts) * static_cast<std::int64_t>(dtype_size_bytes(dtype)));
  }
  if (recv_counts == nullptr && known_recv_counts == nullptr) {
    throw ConfigError(std::string(kName) + ": recv_counts must point to a vector (or pass known_recv_counts)");
  }
}

CollectiveHandle all_to_all_v(transport::Communicator& comm, const AllToAllVOptions& options) {
  options.validate(comm);
  if (options.algorithm == Algorithm::native) {
    transport::NativeCollectives& native = detail::require_native(comm, "all_to_all_v");
    detail::run_native(detail::collective_name("all_to_all_v(native)", options.tag),
                       [&] { exchange_native(native, comm.size(), options); });
    return CollectiveHandle{};
  }
  return launch_collective(
      comm, detail::collective_name("all_to_all_v", options.tag), options.timeout,
      [&comm, options](transport::Deadline deadline) { exchange_pairwise(comm, options, deadline); });
}

}  // namespace epmoe::comm
