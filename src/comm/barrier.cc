#include "comm/barrier.h"

#include "comm/tag.h"

namespace epmoe::comm {

void BarrierOptions::validate(const transport::Communicator& comm) const {
  detail::check_common("barrier", tag, timeout);
}

CollectiveHandle barrier(transport::Communicator& comm, const BarrierOptions& options) {
  options.validate(comm);
  if (options.algorithm == Algorithm::native) {
    transport::NativeCollectives& native = detail::require_native(comm, "barrier");
    detail::run_native(detail::collective_name("barrier(native)", options.tag), [&] { native.barrier(); });
    return CollectiveHandle{};
  }
  return launch_collective(comm, detail::collective_name("barrier", options.tag), options.timeout,
                           [&comm, options](transport::Deadline deadline) {
                             const int num_ranks = comm.size();
                             const int rank = comm.rank();
                             const transport::Tag tag = make_tag(CollectiveKind::barrier, options.tag, Slot::barrier);
                             for (int distance = 1; distance < num_ranks; distance <<= 1) {
                               auto recv = comm.irecv((rank - distance + num_ranks) % num_ranks, tag, nullptr, 0);
                               auto send = comm.isend((rank + distance) % num_ranks, tag, nullptr, 0);
                               if (distance == 1) detail::collective_fault_point(comm);
                               recv->wait_until(deadline);
                               send->wait_until(deadline);
                             }
                           });
}

}  // namespace epmoe::comm
