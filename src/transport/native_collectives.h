// A transport's own collectives, behind comm/'s `Algorithm::native` choice, so
// that our algorithms can be compared with the vendor's in the same run
// without comm/ seeing MPI. Only the mpi transport provides them.
//
// All calls are blocking and run on the calling thread, which keeps their
// order identical on every rank (MPI requires collectives on one communicator
// to be called in the same order everywhere; starting them from worker
// threads would race). Counts are 64-bit here; an implementation whose own
// counts are narrower (MPI's int) rejects larger ones with ConfigError.
#pragma once

#include <cstdint>
#include <span>

namespace epmoe::transport {

class NativeCollectives {
 public:
  virtual ~NativeCollectives() = default;

  // output = concatenation of every rank's `num_bytes_per_rank` input bytes.
  virtual void all_gather(const void* input, void* output, std::int64_t num_bytes_per_rank) = 0;
  // Unequal blocks: rank r contributes num_bytes_by_rank[r] bytes; output
  // is their concatenation in rank order.
  virtual void all_gather_v(const void* input, void* output, std::span<const std::int64_t> num_bytes_by_rank) = 0;
  // Sums f32 blocks: input holds size() blocks of num_elements_per_rank[r]
  // floats; output receives the sum of block rank(). Uses
  // MPI_Reduce_scatter_block when all counts are equal.
  virtual void reduce_scatter_sum_f32(const float* input, float* output,
                                      std::span<const std::int64_t> num_elements_per_rank) = 0;
  virtual void all_reduce_sum_f32(float* data, std::int64_t num_elements) = 0;
  // recv_counts[r] = the count rank r sent to this rank.
  virtual void all_to_all_counts(std::span<const std::int64_t> send_counts, std::span<std::int64_t> recv_counts) = 0;
  // Byte counts per peer; data packed in rank order on both sides.
  virtual void all_to_all_v(const void* input, std::span<const std::int64_t> send_bytes, void* output,
                            std::span<const std::int64_t> recv_bytes) = 0;
  virtual void broadcast(void* data, std::int64_t num_bytes, int root) = 0;
  virtual void barrier() = 0;
};

}  // namespace epmoe::transport
