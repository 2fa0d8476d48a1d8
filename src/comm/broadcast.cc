#include "comm/broadcast.h"

#include <memory>
#include <vector>

#include "comm/tag.h"
#include "core/error.h"

namespace epmoe::comm {

void BroadcastOptions::validate(const transport::Communicator& comm) const {
  constexpr const char* kName = "broadcast";
  detail::check_common(kName, tag, timeout);
  detail::check_count(kName, "num_elements", num_elements);
  if (root < 0 || root >= comm.size()) {
    throw ConfigError(std::string(kName) + ": root = " + std::to_string(root) + ": must be in [0, " +
                      std::to_string(comm.size()) + ")");
  }
  detail::check_buffer(kName, "data", data, num_elements * static_cast<std::int64_t>(dtype_size_bytes(dtype)));
}

CollectiveHandle broadcast(transport::Communicator& comm, const BroadcastOptions& options) {
  options.validate(comm);
  const std::int64_t num_bytes = options.num_elements * static_cast<std::int64_t>(dtype_size_bytes(options.dtype));
  if (options.algorithm == Algorithm::native) {
    transport::NativeCollectives& native = detail::require_native(comm, "broadcast");
    detail::run_native(detail::collective_name("broadcast(native)", options.tag),
                       [&] { native.broadcast(options.data, num_bytes, options.root); });
    return CollectiveHandle{};
  }
  return launch_collective(comm, detail::collective_name("broadcast", options.tag), options.timeout,
                           [&comm, options, num_bytes](transport::Deadline deadline) {
                             const int num_ranks = comm.size();
                             const int relative = (comm.rank() - options.root + num_ranks) % num_ranks;
                             auto absolute = [&](int v) { return (v + options.root) % num_ranks; };
                             const transport::Tag tag = make_tag(CollectiveKind::broadcast, options.tag, Slot::data);
                             int mask = 1;
                             while (mask < num_ranks) {  // receive from the parent: clear the lowest set bit
                               if (relative & mask) {
                                 auto from_parent = comm.irecv(absolute(relative - mask), tag, options.data, num_bytes);
                                 detail::collective_fault_point(comm);  // the receive is posted
                                 from_parent->wait_until(deadline);
                                 break;
                               }
                               mask <<= 1;
                             }
                             std::vector<std::unique_ptr<transport::Request>> sends;
                             for (mask >>= 1; mask > 0; mask >>= 1) {
                               if (relative + mask < num_ranks) {
                                 sends.push_back(comm.isend(absolute(relative + mask), tag, options.data, num_bytes));
                               }
                             }
                             if (relative == 0) detail::collective_fault_point(comm);  // the root's sends are posted
                             for (auto& send : sends) send->wait_until(deadline);
                           });
}

}  // namespace epmoe::comm
