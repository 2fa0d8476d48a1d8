#include "comm/all_gather.h"

#include <cstring>

#include "comm/ring.h"
#include "core/error.h"

namespace epmoe::comm {

std::int64_t AllGatherOptions::block_elements(int rank) const {
  return num_elements_by_rank.empty() ? num_elements_per_rank : num_elements_by_rank[rank];
}

std::int64_t AllGatherOptions::total_elements(int num_ranks) const {
  if (num_elements_by_rank.empty()) return num_elements_per_rank * num_ranks;
  std::int64_t total = 0;
  for (std::int64_t count : num_elements_by_rank) total += count;
  return total;
}

void AllGatherOptions::validate(const transport::Communicator& comm) const {
  constexpr const char* kName = "ring_all_gather";
  detail::check_common(kName, tag, timeout);
  detail::check_count(kName, "num_elements_per_rank", num_elements_per_rank);
  if (!num_elements_by_rank.empty()) {
    if (static_cast<int>(num_elements_by_rank.size()) != comm.size()) {
      throw ConfigError(std::string(kName) + ": num_elements_by_rank has " +
                        std::to_string(num_elements_by_rank.size()) + " entries: must have one per rank (" +
                        std::to_string(comm.size()) + ")");
    }
    for (std::int64_t count : num_elements_by_rank) detail::check_count(kName, "num_elements_by_rank[r]", count);
    if (num_elements_per_rank != 0) {
      throw ConfigError(std::string(kName) + ": num_elements_per_rank = " + std::to_string(num_elements_per_rank) +
                        " with num_elements_by_rank set: give one of them (equal or unequal blocks)");
    }
  }
  if (pipe < 1) throw ConfigError(std::string(kName) + ": pipe = " + std::to_string(pipe) + ": must be >= 1");
  const auto esize = static_cast<std::int64_t>(dtype_size_bytes(dtype));
  detail::check_buffer(kName, "input", input, block_elements(comm.rank()) * esize);
  detail::check_buffer(kName, "output", output, total_elements(comm.size()) * esize);
}

CollectiveHandle ring_all_gather(transport::Communicator& comm, const AllGatherOptions& options) {
  options.validate(comm);
  const std::size_t esize = dtype_size_bytes(options.dtype);
  detail::BlockLayout layout;
  if (options.num_elements_by_rank.empty()) {
    layout = detail::BlockLayout::equal(comm.size(), options.num_elements_per_rank);
  } else {
    layout.num_elements = options.num_elements_by_rank;
    std::int64_t offset = 0;
    for (std::int64_t count : layout.num_elements) {
      layout.offset.push_back(offset);
      offset += count;
    }
  }
  const std::int64_t own_bytes = layout.num_elements[comm.rank()] * static_cast<std::int64_t>(esize);
  auto* output = static_cast<std::byte*>(options.output);
  std::byte* own_slot = output + layout.offset[comm.rank()] * static_cast<std::int64_t>(esize);
  transport::NativeCollectives* native =
      options.algorithm == Algorithm::native ? &detail::require_native(comm, "ring_all_gather") : nullptr;
  const std::string name = detail::collective_name(
      options.algorithm == Algorithm::native ? "all_gather(native)" : "ring_all_gather", options.tag);

  if (native != nullptr) {
    std::vector<std::int64_t> bytes_by_rank;
    for (std::int64_t count : layout.num_elements) bytes_by_rank.push_back(count * static_cast<std::int64_t>(esize));
    detail::run_native(name, [&] {
      if (options.num_elements_by_rank.empty()) {
        native->all_gather(options.input, options.output, own_bytes);
      } else {
        native->all_gather_v(options.input, options.output, bytes_by_rank);
      }
    });
    return CollectiveHandle{};
  }
  // The prologue copies this rank's block into place and posts every
  // receive and the first sends; the progress thread forwards the rest.
  auto gather = std::make_shared<detail::RingAllGather>(comm, std::move(layout), esize, output,
                                                        options.direction == RingDirection::bidirectional, options.pipe,
                                                        CollectiveKind::all_gather, options.tag);
  return launch_collective(
      comm, name, options.timeout,
      [gather, input = options.input, own_bytes, own_slot](transport::Deadline) {
        if (own_bytes > 0 && input != own_slot) std::memcpy(own_slot, input, static_cast<std::size_t>(own_bytes));
        gather->start();
      },
      [gather](transport::Deadline deadline) { gather->finish(deadline); });
}

}  // namespace epmoe::comm
