#include "transport/mpi/native_collectives.h"

#include <algorithm>
#include <climits>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"

namespace epmoe::transport::mpi {
namespace {

// MPI counts are int: native collectives reject anything larger (ours do not).
int to_mpi_count(std::int64_t count, const char* what) {
  if (count < 0 || count > INT_MAX) {
    throw ConfigError(std::string("native MPI collective: ") + what + " = " + std::to_string(count) +
                      " does not fit MPI's int count; use algorithm=ring");
  }
  return static_cast<int>(count);
}

std::vector<int> to_mpi_counts(std::span<const std::int64_t> counts, const char* what) {
  std::vector<int> out(counts.size());
  for (std::size_t i = 0; i < counts.size(); ++i) out[i] = to_mpi_count(counts[i], what);
  return out;
}

std::vector<int> displacements(const std::vector<int>& counts, const char* what) {
  std::vector<int> displs(counts.size());
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    displs[i] = to_mpi_count(offset, what);
    offset += counts[i];
  }
  return displs;
}

}  // namespace

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw PeerError(std::string(call) + " failed: " + std::string(text, length));
}

void MpiNativeCollectives::all_gather(const void* input, void* output, std::int64_t num_bytes_per_rank) {
  const int count = to_mpi_count(num_bytes_per_rank, "bytes per rank");
  int rank = 0;
  MPI_Comm_rank(comm_, &rank);
  // MPI forbids aliased buffers; the in-place form says the same thing.
  const bool in_place = input == static_cast<const char*>(output) + static_cast<std::int64_t>(rank) * count;
  check_mpi(MPI_Allgather(in_place ? MPI_IN_PLACE : input, count, MPI_BYTE, output, count, MPI_BYTE, comm_),
            "MPI_Allgather");
}

void MpiNativeCollectives::all_gather_v(const void* input, void* output,
                                        std::span<const std::int64_t> num_bytes_by_rank) {
  const std::vector<int> counts = to_mpi_counts(num_bytes_by_rank, "bytes of a rank");
  const std::vector<int> displs = displacements(counts, "output offset");
  int rank = 0;
  MPI_Comm_rank(comm_, &rank);
  const bool in_place = input == static_cast<const char*>(output) + displs[rank];
  check_mpi(MPI_Allgatherv(in_place ? MPI_IN_PLACE : input, counts[rank], MPI_BYTE, output, counts.data(),
                           displs.data(), MPI_BYTE, comm_),
            "MPI_Allgatherv");
}

void MpiNativeCollectives::reduce_scatter_sum_f32(const float* input, float* output,
                                                  std::span<const std::int64_t> num_elements_per_rank) {
  const std::vector<int> counts = to_mpi_counts(num_elements_per_rank, "elements per rank");
  const bool equal = std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts[0]; });
  if (equal) {
    check_mpi(MPI_Reduce_scatter_block(input, output, counts[0], MPI_FLOAT, MPI_SUM, comm_),
              "MPI_Reduce_scatter_block");
  } else {
    check_mpi(MPI_Reduce_scatter(input, output, counts.data(), MPI_FLOAT, MPI_SUM, comm_), "MPI_Reduce_scatter");
  }
}

void MpiNativeCollectives::all_reduce_sum_f32(float* data, std::int64_t num_elements) {
  const int count = to_mpi_count(num_elements, "elements");
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce");
}

void MpiNativeCollectives::all_to_all_counts(std::span<const std::int64_t> send_counts,
                                             std::span<std::int64_t> recv_counts) {
  static_assert(sizeof(std::int64_t) == sizeof(long long));
  check_mpi(MPI_Alltoall(send_counts.data(), 1, MPI_LONG_LONG, recv_counts.data(), 1, MPI_LONG_LONG, comm_),
            "MPI_Alltoall");
}

void MpiNativeCollectives::all_to_all_v(const void* input, std::span<const std::int64_t> send_bytes, void* output,
                                        std::span<const std::int64_t> recv_bytes) {
  const std::vector<int> send_counts = to_mpi_counts(send_bytes, "send bytes");
  const std::vector<int> recv_counts = to_mpi_counts(recv_bytes, "receive bytes");
  const std::vector<int> send_displs = displacements(send_counts, "send offset");
  const std::vector<int> recv_displs = displacements(recv_counts, "receive offset");
  check_mpi(MPI_Alltoallv(input, send_counts.data(), send_displs.data(), MPI_BYTE, output, recv_counts.data(),
                          recv_displs.data(), MPI_BYTE, comm_),
            "MPI_Alltoallv");
}

void MpiNativeCollectives::broadcast(void* data, std::int64_t num_bytes, int root) {
  check_mpi(MPI_Bcast(data, to_mpi_count(num_bytes, "bytes"), MPI_BYTE, root, comm_), "MPI_Bcast");
}

void MpiNativeCollectives::barrier() { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

}  // namespace epmoe::transport::mpi
