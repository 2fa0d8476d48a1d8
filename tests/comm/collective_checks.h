// Rank bodies shared by the threads tests and the mpirun test: each runs one
// collective on every rank of `comm` and checks the result against a naive
// reference. Every rank draws every other rank's input from the same seed
// (Rng(seed).fork(rank)), so the reference needs no communication.
// Failures are reported through gtest EXPECT/ASSERT (thread-safe).
#pragma once

#include <cstdint>
#include <vector>

#include <epmoe/dtype.h>

#include "comm/algorithm.h"
#include "comm/all_gather.h"
#include "transport/communicator.h"

namespace epmoe::comm::testing {

// Random bit patterns: bf16 and fp8 move as bytes, compared bit for bit.
std::vector<std::byte> random_bytes(std::uint64_t seed, int rank, std::int64_t num_bytes);
std::vector<float> random_floats(std::uint64_t seed, int rank, std::int64_t num_elements);
// Random bf16 values of moderate magnitude (no NaN / Inf), as raw bits.
std::vector<std::uint16_t> random_bf16(std::uint64_t seed, int rank, std::int64_t num_elements);
float bf16_bits_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16_bits(float value);  // nearest even

void check_all_gather(transport::Communicator& comm, std::int64_t num_elements_per_rank, DType dtype,
                      RingDirection direction, std::int64_t pipe, Algorithm algorithm, std::uint32_t tag);
// Unequal blocks (num_elements_by_rank = counts): bit-equal to a naive
// gather, also in place.
void check_all_gather_v(transport::Communicator& comm, const std::vector<std::int64_t>& counts, DType dtype,
                        RingDirection direction, std::int64_t pipe, Algorithm algorithm, std::uint32_t tag);
// counts[r] elements in block r. Ring: bit-equal to the documented ring
// order; every algorithm: within R * epsilon * sum|x| of a double reference;
// a second run gives the same bits. wire_dtype bf16: partial sums rounded to
// bf16 at every link, within the derived bound of docs/NUMERICS.md.
void check_reduce_scatter(transport::Communicator& comm, const std::vector<std::int64_t>& counts, DType dtype,
                          RingDirection direction, Algorithm algorithm, std::uint32_t tag,
                          DType wire_dtype = DType::f32);
// Random counts in [0, max_count], some forced to 0.
void check_all_to_all_v(transport::Communicator& comm, std::uint64_t seed, std::int64_t max_count, DType dtype,
                        Algorithm algorithm, std::uint32_t tag);
void check_all_reduce(transport::Communicator& comm, std::int64_t num_elements, DType dtype, Algorithm algorithm,
                      std::uint32_t tag);
void check_broadcast(transport::Communicator& comm, std::int64_t num_elements, int root, Algorithm algorithm,
                     std::uint32_t tag);
// All-gather and reduce-scatter in flight at once (different tags), started
// and waited in opposite orders on even and odd ranks.
void check_two_in_flight(transport::Communicator& comm, std::int64_t num_elements);
// The collectives above over the sweeps of counts the issue asks for.
void check_everything(transport::Communicator& comm, Algorithm algorithm);

}  // namespace epmoe::comm::testing
