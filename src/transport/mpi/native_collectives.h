// MPI's own collectives behind transport/native_collectives.h (internal to
// transport/mpi/; reached through MpiCommunicator::native_collectives()).
// Run with OpenMPI's default tuned component settings, which is their best
// configuration we know of on this machine; DESIGN.md §7 records that its
// MPI_Reduce_scatter_block runs at ~0.1 GB/s here, which is why comm/'s
// reduce_scatter never uses it and why the benchmark shows it only as a peer.
#pragma once

#include <mpi.h>

#include "transport/native_collectives.h"

namespace epmoe::transport::mpi {

class MpiNativeCollectives final : public NativeCollectives {
 public:
  explicit MpiNativeCollectives(MPI_Comm comm) : comm_(comm) {}

  void all_gather(const void* input, void* output, std::int64_t num_bytes_per_rank) override;
  void all_gather_v(const void* input, void* output, std::span<const std::int64_t> num_bytes_by_rank) override;
  void reduce_scatter_sum_f32(const float* input, float* output,
                              std::span<const std::int64_t> num_elements_per_rank) override;
  void all_reduce_sum_f32(float* data, std::int64_t num_elements) override;
  void all_to_all_counts(std::span<const std::int64_t> send_counts, std::span<std::int64_t> recv_counts) override;
  void all_to_all_v(const void* input, std::span<const std::int64_t> send_bytes, void* output,
                    std::span<const std::int64_t> recv_bytes) override;
  void broadcast(void* data, std::int64_t num_bytes, int root) override;
  void barrier() override;

 private:
  MPI_Comm comm_;  // not owned: MpiCommunicator's
};

// Throws PeerError naming `call` and MPI's error string when rc != MPI_SUCCESS.
void check_mpi(int rc, const char* call);

}  // namespace epmoe::transport::mpi
