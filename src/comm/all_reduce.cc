#include "comm/all_reduce.h"

#include "comm/ring.h"
#include "core/error.h"

namespace epmoe::comm {

void AllReduceOptions::validate(const transport::Communicator& comm) const {
  constexpr const char* kName = "all_reduce";
  detail::check_common(kName, tag, timeout);
  detail::check_count(kName, "num_elements", num_elements);
  if (dtype != DType::f32 && dtype != DType::bf16) {
    throw ConfigError(std::string(kName) + ": dtype = " + std::string(dtype_name(dtype)) +
                      ": must be f32 or bf16 (sums are taken in f32)");
  }
  if (algorithm == Algorithm::native && dtype != DType::f32) {
    throw ConfigError(std::string(kName) + ": algorithm = native supports dtype f32 only");
  }
  detail::check_buffer(kName, "data", data, num_elements * static_cast<std::int64_t>(dtype_size_bytes(dtype)));
}

CollectiveHandle all_reduce(transport::Communicator& comm, const AllReduceOptions& options) {
  options.validate(comm);
  if (options.algorithm == Algorithm::native) {
    transport::NativeCollectives& native = detail::require_native(comm, "all_reduce");
    detail::run_native(detail::collective_name("all_reduce(native)", options.tag),
                       [&] { native.all_reduce_sum_f32(static_cast<float*>(options.data), options.num_elements); });
    return CollectiveHandle{};
  }
  return launch_collective(
      comm, detail::collective_name("all_reduce", options.tag), options.timeout,
      [&comm, options](transport::Deadline deadline) {
        const detail::BlockLayout layout = detail::BlockLayout::split(comm.size(), options.num_elements);
        const std::size_t esize = dtype_size_bytes(options.dtype);
        auto* data = static_cast<std::byte*>(options.data);
        std::byte* own_block = data + layout.offset[comm.rank()] * esize;
        detail::ring_reduce_scatter_blocks(comm, layout, options.dtype, DType::f32, data, own_block,
                                           /*bidirectional=*/true, CollectiveKind::all_reduce, options.tag, deadline);
        detail::ring_all_gather_blocks(comm, layout, esize, data, /*bidirectional=*/true, /*pipe=*/1,
                                       CollectiveKind::all_reduce, options.tag, deadline);
      });
}

}  // namespace epmoe::comm
