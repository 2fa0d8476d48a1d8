#include "comm/all_gather.h"

#include <cstring>

#include "comm/ring.h"
#include "core/error.h"

namespace epmoe::comm {

void AllGatherOptions::validate(const transport::Communicator& comm) const {
  constexpr const char* kName = "ring_all_gather";
  detail::check_common(kName, tag, timeout);
  detail::check_count(kName, "num_elements_per_rank", num_elements_per_rank);
  if (pipe < 1) throw ConfigError(std::string(kName) + ": pipe = " + std::to_string(pipe) + ": must be >= 1");
  const std::int64_t chunk_bytes = num_elements_per_rank * static_cast<std::int64_t>(dtype_size_bytes(dtype));
  detail::check_buffer(kName, "input", input, chunk_bytes);
  detail::check_buffer(kName, "output", output, chunk_bytes * comm.size());
}

CollectiveHandle ring_all_gather(transport::Communicator& comm, const AllGatherOptions& options) {
  options.validate(comm);
  const std::size_t esize = dtype_size_bytes(options.dtype);
  const std::int64_t chunk_bytes = options.num_elements_per_rank * static_cast<std::int64_t>(esize);
  auto* output = static_cast<std::byte*>(options.output);
  std::byte* own_slot = output + chunk_bytes * comm.rank();
  transport::NativeCollectives* native =
      options.algorithm == Algorithm::native ? &detail::require_native(comm, "ring_all_gather") : nullptr;
  const std::string name = detail::collective_name(
      options.algorithm == Algorithm::native ? "all_gather(native)" : "ring_all_gather", options.tag);

  if (native != nullptr) {
    detail::run_native(name, [&] { native->all_gather(options.input, options.output, chunk_bytes); });
    return CollectiveHandle{};
  }
  return launch_collective(comm, name, options.timeout, [&comm, options, esize, chunk_bytes, output,
                                                   own_slot](transport::Deadline deadline) {
    if (chunk_bytes > 0 && options.input != own_slot) std::memcpy(own_slot, options.input, chunk_bytes);
    detail::ring_all_gather_blocks(
        comm, detail::BlockLayout::equal(comm.size(), options.num_elements_per_rank), esize, output,
        options.direction == RingDirection::bidirectional, options.pipe, CollectiveKind::all_gather,
        options.tag, deadline);
  });
}

}  // namespace epmoe::comm
