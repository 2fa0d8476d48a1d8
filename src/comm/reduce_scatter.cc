#include "comm/reduce_scatter.h"

#include "comm/ring.h"
#include "core/error.h"

namespace epmoe::comm {

void ReduceScatterOptions::validate(const transport::Communicator& comm) const {
  constexpr const char* kName = "reduce_scatter";
  detail::check_common(kName, tag, timeout);
  if (static_cast<int>(num_elements_per_rank.size()) != comm.size()) {
    throw ConfigError(std::string(kName) + ": num_elements_per_rank has " +
                      std::to_string(num_elements_per_rank.size()) + " entries: must have one per rank (" +
                      std::to_string(comm.size()) + ")");
  }
  std::int64_t total = 0;
  for (std::int64_t count : num_elements_per_rank) {
    detail::check_count(kName, "num_elements_per_rank[r]", count);
    total += count;
  }
  if (dtype != DType::f32 && dtype != DType::bf16) {
    throw ConfigError(std::string(kName) + ": dtype = " + std::string(dtype_name(dtype)) +
                      ": must be f32 or bf16 (sums are taken in f32)");
  }
  if (wire_dtype != DType::f32 && wire_dtype != DType::bf16) {
    throw ConfigError(std::string(kName) + ": wire_dtype = " + std::string(dtype_name(wire_dtype)) +
                      ": must be f32 or bf16");
  }
  if (algorithm == Algorithm::native && (dtype != DType::f32 || wire_dtype != DType::f32)) {
    throw ConfigError(std::string(kName) + ": algorithm = native supports dtype and wire_dtype f32 only");
  }
  const auto esize = static_cast<std::int64_t>(dtype_size_bytes(dtype));
  detail::check_buffer(kName, "input", input, total * esize);
  detail::check_buffer(kName, "output", output, num_elements_per_rank[comm.rank()] * esize);
}

CollectiveHandle reduce_scatter(transport::Communicator& comm, const ReduceScatterOptions& options) {
  options.validate(comm);
  if (options.algorithm == Algorithm::native) {
    transport::NativeCollectives& native = detail::require_native(comm, "reduce_scatter");
    detail::run_native(detail::collective_name("reduce_scatter(native)", options.tag), [&] {
      native.reduce_scatter_sum_f32(static_cast<const float*>(options.input), static_cast<float*>(options.output),
                                    options.num_elements_per_rank);
    });
    return CollectiveHandle{};
  }
  detail::BlockLayout layout;
  layout.num_elements = options.num_elements_per_rank;
  std::int64_t offset = 0;
  for (std::int64_t count : layout.num_elements) {
    layout.offset.push_back(offset);
    offset += count;
  }
  return launch_collective(comm, detail::collective_name("reduce_scatter", options.tag), options.timeout,
                           [&comm, options, layout = std::move(layout)](transport::Deadline deadline) {
                             detail::ring_reduce_scatter_blocks(comm, layout, options.dtype, options.wire_dtype,
                                                                static_cast<const std::byte*>(options.input),
                                                                static_cast<std::byte*>(options.output),
                                                                options.direction == RingDirection::bidirectional,
                                                                CollectiveKind::reduce_scatter, options.tag, deadline);
                           });
}

}  // namespace epmoe::comm
