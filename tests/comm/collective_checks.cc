#include "collective_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "comm/all_reduce.h"
#include "comm/all_to_all_v.h"
#include "comm/broadcast.h"
#include "comm/reduce_scatter.h"
#include "core/rng.h"

namespace epmoe::comm::testing {

std::vector<std::byte> random_bytes(std::uint64_t seed, int rank, std::int64_t num_bytes) {
  Rng rng = Rng(seed).fork(static_cast<std::uint64_t>(rank));
  std::vector<std::byte> bytes(static_cast<std::size_t>(num_bytes));
  for (auto& byte : bytes) byte = static_cast<std::byte>(rng.next_u64());
  return bytes;
}

std::vector<float> random_floats(std::uint64_t seed, int rank, std::int64_t num_elements) {
  Rng rng = Rng(seed).fork(static_cast<std::uint64_t>(rank));
  std::vector<float> values(static_cast<std::size_t>(num_elements));
  for (auto& value : values) value = rng.uniform(-2.0f, 2.0f);
  return values;
}

float bf16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t word = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

std::uint16_t float_to_bf16_bits(float value) {
  std::uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  word += 0x7fffu + ((word >> 16) & 1u);
  return static_cast<std::uint16_t>(word >> 16);
}

std::vector<std::uint16_t> random_bf16(std::uint64_t seed, int rank, std::int64_t num_elements) {
  std::vector<float> values = random_floats(seed, rank, num_elements);
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16_bits(values[i]);
  return bits;
}

namespace {

// Element `index` (global) of block `block` summed in the order comm/ring.h
// documents: the first ceil(n/2) elements of a block of n from rank block+1
// onwards (clockwise lane), the rest from rank block-1 backwards, rank
// `block` itself last; one direction only: all clockwise. A bf16 wire
// rounds every partial sum that crosses a link (R-1 of them), nothing else.
float ring_order_sum(const std::vector<std::vector<float>>& inputs, int block, std::int64_t index_in_block,
                     std::int64_t index, std::int64_t block_size, bool bidirectional, bool bf16_wire) {
  const int num_ranks = static_cast<int>(inputs.size());
  const int d = bidirectional && index_in_block >= (block_size + 1) / 2 ? -1 : 1;
  auto rank_at = [&](int k) { return ((block + k * d) % num_ranks + num_ranks) % num_ranks; };
  auto sent = [&](float partial) { return bf16_wire ? bf16_bits_to_float(float_to_bf16_bits(partial)) : partial; };
  float sum = inputs[rank_at(1)][index];
  if (num_ranks > 1) sum = sent(sum);
  for (int k = 2; k <= num_ranks; ++k) {
    sum += inputs[rank_at(k)][index];
    if (k < num_ranks) sum = sent(sum);
  }
  return sum;
}

}  // namespace

void check_all_gather(transport::Communicator& comm, std::int64_t num_elements_per_rank, DType dtype,
                      RingDirection direction, std::int64_t pipe, Algorithm algorithm, std::uint32_t tag) {
  const int num_ranks = comm.size();
  const std::int64_t chunk_bytes = num_elements_per_rank * static_cast<std::int64_t>(dtype_size_bytes(dtype));
  const std::uint64_t seed = 1000 + static_cast<std::uint64_t>(num_elements_per_rank);
  std::vector<std::byte> expected;
  for (int r = 0; r < num_ranks; ++r) {
    const auto chunk = random_bytes(seed, r, chunk_bytes);
    expected.insert(expected.end(), chunk.begin(), chunk.end());
  }
  const std::vector<std::byte> input = random_bytes(seed, comm.rank(), chunk_bytes);
  // Poisoned output: a byte the algorithm forgets to write shows up.
  std::vector<std::byte> output(expected.size(), std::byte{0xA5});
  AllGatherOptions options;
  options.input = input.data();
  options.output = output.data();
  options.num_elements_per_rank = num_elements_per_rank;
  options.dtype = dtype;
  options.direction = direction;
  options.pipe = pipe;
  options.algorithm = algorithm;
  options.tag = tag;
  ring_all_gather(comm, options).wait();
  ASSERT_TRUE(output == expected) << "all-gather differs from the naive gather: R=" << num_ranks
                                  << " n=" << num_elements_per_rank << " dtype=" << dtype_name(dtype)
                                  << " pipe=" << pipe << " rank=" << comm.rank();
  // In place: the input is this rank's slot of the output.
  std::fill(output.begin(), output.end(), std::byte{0xA5});
  std::copy(input.begin(), input.end(), output.begin() + comm.rank() * chunk_bytes);
  options.input = output.data() + comm.rank() * chunk_bytes;
  options.tag = tag + 1000;
  ring_all_gather(comm, options).wait();
  ASSERT_TRUE(output == expected) << "in-place all-gather differs: R=" << num_ranks << " n=" << num_elements_per_rank
                                  << " rank=" << comm.rank();
}

void check_all_gather_v(transport::Communicator& comm, const std::vector<std::int64_t>& counts, DType dtype,
                        RingDirection direction, std::int64_t pipe, Algorithm algorithm, std::uint32_t tag) {
  const int num_ranks = comm.size();
  const auto esize = static_cast<std::int64_t>(dtype_size_bytes(dtype));
  std::uint64_t seed = 3000;
  for (std::int64_t count : counts) seed = seed * 31 + static_cast<std::uint64_t>(count);
  std::vector<std::byte> expected;  // the naive gather: blocks concatenated in rank order
  std::int64_t own_offset = 0;
  for (int r = 0; r < num_ranks; ++r) {
    if (r == comm.rank()) own_offset = static_cast<std::int64_t>(expected.size());
    const auto block = random_bytes(seed, r, counts[r] * esize);
    expected.insert(expected.end(), block.begin(), block.end());
  }
  const std::vector<std::byte> input = random_bytes(seed, comm.rank(), counts[comm.rank()] * esize);
  std::vector<std::byte> output(expected.size(), std::byte{0xA5});
  AllGatherOptions options{.input = input.data(),
                           .output = output.data(),
                           .num_elements_by_rank = counts,
                           .dtype = dtype,
                           .direction = direction,
                           .pipe = pipe,
                           .algorithm = algorithm,
                           .tag = tag};
  std::string what = "R=" + std::to_string(num_ranks) + " counts=";
  for (std::int64_t count : counts) what += std::to_string(count) + ",";
  what += " dtype=" + std::string(dtype_name(dtype)) + " pipe=" + std::to_string(pipe) +
          " rank=" + std::to_string(comm.rank());
  ring_all_gather(comm, options).wait();
  ASSERT_TRUE(output == expected) << "unequal all-gather differs from the naive gather: " << what;
  std::fill(output.begin(), output.end(), std::byte{0xA5});  // in place
  std::copy(input.begin(), input.end(), output.begin() + own_offset);
  options.input = output.data() + own_offset;
  options.tag = tag + 1000;
  ring_all_gather(comm, options).wait();
  ASSERT_TRUE(output == expected) << "in-place unequal all-gather differs: " << what;
}

void check_reduce_scatter(transport::Communicator& comm, const std::vector<std::int64_t>& counts, DType dtype,
                          RingDirection direction, Algorithm algorithm, std::uint32_t tag, DType wire_dtype) {
  const int num_ranks = comm.size();
  const int rank = comm.rank();
  std::int64_t total = 0;
  std::vector<std::int64_t> offsets;
  for (std::int64_t count : counts) {
    offsets.push_back(total);
    total += count;
  }
  const std::uint64_t seed = 2000 + static_cast<std::uint64_t>(total);
  // Every rank's input, as f32 values (bf16 inputs are exactly representable).
  std::vector<std::vector<float>> inputs(num_ranks);
  std::vector<std::uint16_t> own_bf16;
  for (int r = 0; r < num_ranks; ++r) {
    if (dtype == DType::f32) {
      inputs[r] = random_floats(seed, r, total);
    } else {
      const auto bits = random_bf16(seed, r, total);
      if (r == rank) own_bf16 = bits;
      for (std::uint16_t b : bits) inputs[r].push_back(bf16_bits_to_float(b));
    }
  }
  const std::int64_t n = counts[rank];
  const std::int64_t begin = offsets[rank];
  const auto esize = dtype_size_bytes(dtype);
  std::vector<std::byte> output(static_cast<std::size_t>(n * esize), std::byte{0xA5});

  auto run_once = [&] {
    ReduceScatterOptions options;
    options.input =
        dtype == DType::f32 ? static_cast<const void*>(inputs[rank].data()) : static_cast<const void*>(own_bf16.data());
    options.output = output.data();
    options.num_elements_per_rank = counts;
    options.dtype = dtype;
    options.wire_dtype = wire_dtype;
    options.direction = direction;
    options.algorithm = algorithm;
    options.tag = tag;
    reduce_scatter(comm, options).wait();
  };
  auto value_at = [&](std::int64_t i) {
    if (dtype == DType::f32) {
      float value;
      std::memcpy(&value, output.data() + i * 4, 4);
      return value;
    }
    std::uint16_t bits;
    std::memcpy(&bits, output.data() + i * 2, 2);
    return bf16_bits_to_float(bits);
  };

  run_once();
  const std::vector<std::byte> first = output;
  for (std::int64_t i = 0; i < n; ++i) {
    const float ordered = ring_order_sum(inputs, rank, i, begin + i, n, direction == RingDirection::bidirectional,
                                         wire_dtype == DType::bf16);
    double exact = 0.0;
    double magnitude = 0.0;
    for (int r = 0; r < num_ranks; ++r) {
      exact += inputs[r][begin + i];
      magnitude += std::fabs(inputs[r][begin + i]);
    }
    const float got = value_at(i);
    if (algorithm == Algorithm::ring) {
      const float expected = dtype == DType::f32 ? ordered : bf16_bits_to_float(float_to_bf16_bits(ordered));
      ASSERT_EQ(std::memcmp(&got, &expected, sizeof(float)), 0)
          << "reduce-scatter element " << i << " of rank " << rank << ": " << got << " != ring-order sum " << expected;
    }
    const double epsilon = dtype == DType::f32 ? std::numeric_limits<float>::epsilon() : 1.0 / 128;
    // A bf16 wire (docs/NUMERICS.md): R-1 roundings of u = 2^-8 on partial
    // sums no larger than sum|x|, each after an f32 addition.
    const double v = 1.0 / 256 + 1.0 / (1 << 24) + 1.0 / 256 / (1 << 24);
    const double wire_factor = wire_dtype == DType::bf16 ? std::pow(1 + v, num_ranks - 1) - 1 : 0.0;
    ASSERT_LE(std::fabs(got - exact), (num_ranks * epsilon + wire_factor) * magnitude + 1e-30)
        << "element " << i << " of rank " << rank;
  }
  // Same inputs, same bits, every run.
  std::fill(output.begin(), output.end(), std::byte{0});
  run_once();
  ASSERT_TRUE(output == first) << "reduce-scatter bits changed between two runs";
}

void check_all_to_all_v(transport::Communicator& comm, std::uint64_t seed, std::int64_t max_count, DType dtype,
                        Algorithm algorithm, std::uint32_t tag) {
  const int num_ranks = comm.size();
  const int rank = comm.rank();
  const auto esize = static_cast<std::int64_t>(dtype_size_bytes(dtype));
  // counts[src][dst], the same on every rank; every third pair sends nothing.
  Rng count_rng(seed);
  std::vector<std::vector<std::int64_t>> counts(num_ranks, std::vector<std::int64_t>(num_ranks));
  for (int src = 0; src < num_ranks; ++src) {
    for (int dst = 0; dst < num_ranks; ++dst) {
      const auto drawn = static_cast<std::int64_t>(count_rng.uniform_int(max_count + 1));
      counts[src][dst] = (src + 2 * dst) % 3 == 0 ? 0 : drawn;
    }
  }
  auto payload = [&](int src) {
    std::int64_t total = 0;
    for (std::int64_t c : counts[src]) total += c;
    return random_bytes(seed + 7, src, total * esize);
  };
  auto offset_in = [&](int src, int dst) {
    std::int64_t offset = 0;
    for (int d = 0; d < dst; ++d) offset += counts[src][d];
    return offset * esize;
  };
  std::vector<std::byte> expected;
  for (int src = 0; src < num_ranks; ++src) {
    const auto data = payload(src);
    const auto begin = data.begin() + offset_in(src, rank);
    expected.insert(expected.end(), begin, begin + counts[src][rank] * esize);
  }
  const std::vector<std::byte> input = payload(rank);
  std::vector<std::byte> output(3, std::byte{0x5A});  // wrong size on purpose: must be resized
  std::vector<std::int64_t> recv_counts;
  AllToAllVOptions options;
  options.input = input.data();
  options.send_counts = counts[rank];
  options.dtype = dtype;
  options.output = &output;
  options.recv_counts = &recv_counts;
  options.algorithm = algorithm;
  options.tag = tag;
  all_to_all_v(comm, options).wait();
  ASSERT_EQ(static_cast<int>(recv_counts.size()), num_ranks);
  for (int src = 0; src < num_ranks; ++src) EXPECT_EQ(recv_counts[src], counts[src][rank]) << "from " << src;
  ASSERT_TRUE(output == expected) << "all_to_all_v payload differs on rank " << rank;

  // Again with the counts known (no count round) into the caller's buffer:
  // the same bytes, and nothing written past the buffer's end.
  std::vector<std::byte> own_buffer(expected.size() + 8, std::byte{0x3C});
  AllToAllVOptions known = options;
  known.output = nullptr;
  known.recv_counts = nullptr;
  known.known_recv_counts = &recv_counts;
  known.recv_buffer = own_buffer.data();
  known.tag = tag + 1;
  all_to_all_v(comm, known).wait();
  ASSERT_TRUE(std::equal(expected.begin(), expected.end(), own_buffer.begin()))
      << "all_to_all_v with known counts differs on rank " << rank;
  for (std::size_t i = expected.size(); i < own_buffer.size(); ++i) ASSERT_EQ(own_buffer[i], std::byte{0x3C});
}

void check_all_reduce(transport::Communicator& comm, std::int64_t num_elements, DType dtype, Algorithm algorithm,
                      std::uint32_t tag) {
  const int num_ranks = comm.size();
  const std::uint64_t seed = 3000 + static_cast<std::uint64_t>(num_elements);
  std::vector<std::vector<float>> inputs(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    if (dtype == DType::f32) {
      inputs[r] = random_floats(seed, r, num_elements);
    } else {
      for (std::uint16_t b : random_bf16(seed, r, num_elements)) inputs[r].push_back(bf16_bits_to_float(b));
    }
  }
  std::vector<float> data_f32 = inputs[comm.rank()];
  std::vector<std::uint16_t> data_bf16;
  for (float v : data_f32) data_bf16.push_back(float_to_bf16_bits(v));
  AllReduceOptions options;
  options.data = dtype == DType::f32 ? static_cast<void*>(data_f32.data()) : static_cast<void*>(data_bf16.data());
  options.num_elements = num_elements;
  options.dtype = dtype;
  options.algorithm = algorithm;
  options.tag = tag;
  all_reduce(comm, options).wait();
  // Block b (n / R elements, the first n % R one longer) is summed in the
  // bidirectional ring order; every rank holds the same bits.
  std::int64_t offset = 0;
  for (int block = 0; block < num_ranks; ++block) {
    const std::int64_t count = num_elements / num_ranks + (block < num_elements % num_ranks ? 1 : 0);
    for (std::int64_t i = offset; i < offset + count; ++i) {
      const float ordered =
          ring_order_sum(inputs, block, i - offset, i, count, /*bidirectional=*/true, /*bf16_wire=*/false);
      double exact = 0.0;
      double magnitude = 0.0;
      for (int r = 0; r < num_ranks; ++r) {
        exact += inputs[r][i];
        magnitude += std::fabs(inputs[r][i]);
      }
      const float got = dtype == DType::f32 ? data_f32[i] : bf16_bits_to_float(data_bf16[i]);
      if (algorithm == Algorithm::ring) {
        const float expected = dtype == DType::f32 ? ordered : bf16_bits_to_float(float_to_bf16_bits(ordered));
        ASSERT_EQ(std::memcmp(&got, &expected, sizeof(float)), 0)
            << "all_reduce element " << i << ": " << got << " vs " << expected;
      }
      const double epsilon = dtype == DType::f32 ? std::numeric_limits<float>::epsilon() : 1.0 / 128;
      ASSERT_LE(std::fabs(got - exact), num_ranks * epsilon * magnitude + 1e-30) << "element " << i;
    }
    offset += count;
  }
}

void check_broadcast(transport::Communicator& comm, std::int64_t num_elements, int root, Algorithm algorithm,
                     std::uint32_t tag) {
  const auto expected = random_bytes(4000 + static_cast<std::uint64_t>(num_elements), root, num_elements * 4);
  std::vector<std::byte> data = comm.rank() == root ? expected : std::vector<std::byte>(expected.size(), std::byte{0});
  BroadcastOptions options;
  options.data = data.data();
  options.num_elements = num_elements;
  options.dtype = DType::f32;
  options.root = root;
  options.algorithm = algorithm;
  options.tag = tag;
  broadcast(comm, options).wait();
  ASSERT_TRUE(data == expected) << "broadcast from root " << root << " differs on rank " << comm.rank();
}

void check_two_in_flight(transport::Communicator& comm, std::int64_t num_elements) {
  const int num_ranks = comm.size();
  const int rank = comm.rank();
  std::vector<std::byte> expected_gather;
  for (int r = 0; r < num_ranks; ++r) {
    const auto chunk = random_bytes(5000, r, num_elements * 4);
    expected_gather.insert(expected_gather.end(), chunk.begin(), chunk.end());
  }
  const auto gather_input = random_bytes(5000, rank, num_elements * 4);
  std::vector<std::byte> gather_output(expected_gather.size());
  AllGatherOptions gather;
  gather.input = gather_input.data();
  gather.output = gather_output.data();
  gather.num_elements_per_rank = num_elements;
  gather.tag = 11;

  // Reduce-scatter of all-ones: block r sums to R exactly.
  std::vector<float> ones(static_cast<std::size_t>(num_elements * num_ranks), 1.0f);
  std::vector<float> reduced(static_cast<std::size_t>(num_elements), 0.0f);
  ReduceScatterOptions reduce;
  reduce.input = ones.data();
  reduce.output = reduced.data();
  reduce.num_elements_per_rank.assign(num_ranks, num_elements);
  reduce.tag = 12;

  CollectiveHandle first, second;
  if (rank % 2 == 0) {
    first = ring_all_gather(comm, gather);
    second = reduce_scatter(comm, reduce);
  } else {
    first = reduce_scatter(comm, reduce);
    second = ring_all_gather(comm, gather);
  }
  second.wait();
  first.wait();
  ASSERT_TRUE(gather_output == expected_gather);
  for (float value : reduced) ASSERT_EQ(value, static_cast<float>(num_ranks));
}

void check_everything(transport::Communicator& comm, Algorithm algorithm) {
  const int num_ranks = comm.size();
  std::uint32_t tag = 100;
  // All-gather: 0, 1 (one direction only), odd and even counts, every dtype.
  for (std::int64_t n : {0, 1, 2, 3, 17, 1000, 4097}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::fp8_e4m3}) {
      if (algorithm == Algorithm::native) {
        check_all_gather(comm, n, dtype, RingDirection::bidirectional, 1, algorithm, tag++);
        continue;
      }
      for (auto direction : {RingDirection::bidirectional, RingDirection::unidirectional}) {
        for (std::int64_t pipe : {1, 3}) check_all_gather(comm, n, dtype, direction, pipe, algorithm, tag++);
      }
    }
  }
  // Unequal all-gather: ragged counts with zero-sized blocks, one non-empty
  // block, and counts of 1 (blocks that cannot be halved).
  {
    std::vector<std::vector<std::int64_t>> ragged(4);
    for (int r = 0; r < num_ranks; ++r) {
      ragged[0].push_back(r % 3 == 1 ? 0 : 3 + 2 * r);  // 3, 0, 7, 9, 0, ...
      ragged[1].push_back(r == num_ranks - 1 ? 1001 : 0);
      ragged[2].push_back(r % 2);
      ragged[3].push_back(517 - 64 * r);
    }
    for (const auto& counts : ragged) {
      for (DType dtype : {DType::f32, DType::fp8_e4m3}) {
        if (algorithm == Algorithm::native) {
          check_all_gather_v(comm, counts, dtype, RingDirection::bidirectional, 1, algorithm, tag++);
          continue;
        }
        for (auto direction : {RingDirection::bidirectional, RingDirection::unidirectional}) {
          for (std::int64_t pipe : {1, 3}) check_all_gather_v(comm, counts, dtype, direction, pipe, algorithm, tag++);
        }
      }
    }
  }
  // Reduce-scatter: equal, unequal and zero counts.
  std::vector<std::vector<std::int64_t>> count_sets = {std::vector<std::int64_t>(num_ranks, 0),
                                                       std::vector<std::int64_t>(num_ranks, 1),
                                                       std::vector<std::int64_t>(num_ranks, 513)};
  std::vector<std::int64_t> unequal;
  for (int r = 0; r < num_ranks; ++r) unequal.push_back(r % 3 == 1 ? 0 : 37 * r + 5);
  count_sets.push_back(unequal);
  for (const auto& counts : count_sets) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      if (algorithm == Algorithm::native && dtype != DType::f32) continue;
      for (auto direction : {RingDirection::bidirectional, RingDirection::unidirectional}) {
        check_reduce_scatter(comm, counts, dtype, direction, algorithm, tag++);
        if (algorithm == Algorithm::native) break;  // MPI has no direction
        // Partial sums on a bf16 wire (the dispatchers' wire_dtype=bf16).
        if (dtype == DType::f32) check_reduce_scatter(comm, counts, dtype, direction, algorithm, tag++, DType::bf16);
      }
    }
  }
  for (std::int64_t max_count : {0, 1, 50}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::fp8_e4m3}) {
      check_all_to_all_v(comm, 6000 + max_count, max_count, dtype, algorithm, tag);
      tag += 2;  // the second exchange (known counts) uses tag + 1
    }
  }
  for (std::int64_t n : {0, 1, 7, 1001}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      if (algorithm == Algorithm::native && dtype != DType::f32) continue;
      check_all_reduce(comm, n, dtype, algorithm, tag++);
    }
  }
  for (int root = 0; root < num_ranks; ++root) check_broadcast(comm, 333, root, algorithm, tag++);
}

}  // namespace epmoe::comm::testing
