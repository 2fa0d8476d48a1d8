#include "comm/ring.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "comm/collective_handle.h"
#include "comm/forked_part.h"
#include "core/error.h"
#include "core/trace_recorder.h"

namespace epmoe::comm::detail {
namespace {

using transport::Communicator;
using transport::Deadline;
using transport::Request;

// bf16 <-> f32 for the reduce-scatter accumulator. The same rounding as
// kernels/convert.h (nearest even, NaN kept quiet); repeated here so that
// comm/ does not link the kernels library (oneDNN, OpenMP) into the
// ThreadSanitizer build.
float bf16_to_f32(std::uint16_t bits) {
  const std::uint32_t word = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}
std::uint16_t f32_to_bf16(float value) {
  std::uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if ((word & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((word >> 16) | 0x40u);
  word += 0x7fffu + ((word >> 16) & 1u);
  return static_cast<std::uint16_t>(word >> 16);
}

// Per progress thread scratch for partial sums, kept across collectives: a
// fresh 8 MiB buffer would cost ~22 ms of first-touch page faults
// (11 µs per 4 KiB page, DESIGN.md §7) on every call.
std::vector<float>& scratch(int which, std::int64_t num_elements) {
  thread_local std::vector<float> buffers[6];  // [lane * 3 + {partial 0, partial 1, f32 copy}]
  std::vector<float>& buffer = buffers[which];
  if (static_cast<std::int64_t>(buffer.size()) < num_elements) buffer.resize(num_elements);
  return buffer;
}

// The same for partial sums that travel as bf16: [lane * 3 + {receive 0,
// receive 1, send}].
std::vector<std::uint16_t>& wire_scratch(int which, std::int64_t num_elements) {
  thread_local std::vector<std::uint16_t> buffers[6];
  std::vector<std::uint16_t>& buffer = buffers[which];
  if (static_cast<std::int64_t>(buffer.size()) < num_elements) buffer.resize(num_elements);
  return buffer;
}

int wrap(int rank, int num_ranks) { return ((rank % num_ranks) + num_ranks) % num_ranks; }

// Runs `convert`, a bf16 wire's conversion of `num_values` values (2 bytes
// read and 4 written, or 4 and 2), charged at the memory rate to the calling
// thread's clock: the reduce-scatter's own, so it delays the collective's
// next send, not the rank's compute. Traced under `name` on the rank's
// collective lanes, where the collective runs: on the compute track, at the
// collective's times, it would overlap the rank's own compute without
// nesting.
template <class Convert>
void charge_wire_conversion(const char* name, std::int64_t num_values, Convert&& convert) {
  if (num_values == 0) return;
  const TraceTrack track = this_thread_trace_track();
  const double begin_us = this_thread_trace_now_us(), bytes = 6.0 * static_cast<double>(num_values);
  {
    const UntracedScope untraced;  // recorded below, on a collective lane
    const ComputeScope charge(name, {.bytes = bytes});
    convert();
  }
  if (track.recorder != nullptr)
    track.recorder->add_collective(track.pid, name, begin_us, this_thread_trace_now_us(),
                                   {{"bytes", bytes}, {"bytes_sent", 0.0}});
}

}  // namespace

BlockLayout BlockLayout::equal(int num_ranks, std::int64_t num_elements_per_rank) {
  BlockLayout layout;
  for (int r = 0; r < num_ranks; ++r) {
    layout.num_elements.push_back(num_elements_per_rank);
    layout.offset.push_back(num_elements_per_rank * r);
  }
  return layout;
}

BlockLayout BlockLayout::split(int num_ranks, std::int64_t num_elements) {
  BlockLayout layout;
  std::int64_t offset = 0;
  for (int r = 0; r < num_ranks; ++r) {
    const std::int64_t count = num_elements / num_ranks + (r < num_elements % num_ranks ? 1 : 0);
    layout.num_elements.push_back(count);
    layout.offset.push_back(offset);
    offset += count;
  }
  return layout;
}

std::int64_t BlockLayout::total() const {
  std::int64_t total = 0;
  for (std::int64_t n : num_elements) total += n;
  return total;
}

LaneSplit split_lanes(std::int64_t num_elements, bool bidirectional) {
  const std::int64_t clockwise = bidirectional ? (num_elements + 1) / 2 : num_elements;
  return LaneSplit{{0, clockwise}, {clockwise, num_elements - clockwise}};
}

RingAllGather::RingAllGather(Communicator& comm, BlockLayout layout, std::size_t element_size_bytes, std::byte* output,
                             bool bidirectional, std::int64_t pipe, CollectiveKind kind, std::uint32_t collective_tag)
    : comm_(comm),
      layout_(std::move(layout)),
      esize_(static_cast<std::int64_t>(element_size_bytes)),
      output_(output),
      bidirectional_(bidirectional),
      pipe_(pipe),
      num_ranks_(comm.size()),
      rank_(comm.rank()),
      num_steps_(comm.size() - 1),
      num_lanes_(bidirectional ? 2 : 1),
      peer_to_{wrap(comm.rank() + 1, comm.size()), wrap(comm.rank() - 1, comm.size())},
      tags_{make_tag(kind, collective_tag, Slot::ring_clockwise),
            make_tag(kind, collective_tag, Slot::ring_counter_clockwise)} {}

// Piece p of lane `lane` of block `block`, in bytes within output.
RingAllGather::Piece RingAllGather::piece(int block, int lane, std::int64_t p) const {
  const LaneSplit split = split_lanes(layout_.num_elements[block], bidirectional_);
  const std::int64_t lane_size = split.lane_size[lane];
  const std::int64_t begin = split.lane_begin[lane] + lane_size * p / pipe_;
  const std::int64_t end = split.lane_begin[lane] + lane_size * (p + 1) / pipe_;
  return Piece{output_ + (layout_.offset[block] + begin) * esize_, (end - begin) * esize_};
}

// Lane 0 (clockwise) at step s sends block rank-s and receives block
// rank-s-1 from rank-1; lane 1 mirrors it: sends block rank+s, receives
// block rank+s+1 from rank+1.
int RingAllGather::sent_block(int lane, int step) const {
  return wrap(lane == 0 ? rank_ - step : rank_ + step, num_ranks_);
}
int RingAllGather::received_block(int lane, int step) const {
  return wrap(lane == 0 ? rank_ - step - 1 : rank_ + step + 1, num_ranks_);
}
std::size_t RingAllGather::recv_index(int lane, int step, std::int64_t p) const {
  return static_cast<std::size_t>((lane * num_steps_ + step) * pipe_ + p);
}

void RingAllGather::start() {
  if (num_ranks_ == 1) return;
  // Every receive is posted up front (each lands in its own place in output),
  // so a sender never waits for its receiver to get round to posting.
  // recvs_[(lane * num_steps + step) * pipe + p]; null for empty pieces.
  recvs_.resize(static_cast<std::size_t>(2 * num_steps_ * pipe_));
  for (auto& sends : sends_) sends.reserve(static_cast<std::size_t>(num_steps_ * pipe_));
  for (int step = 0; step < num_steps_; ++step) {
    for (std::int64_t p = 0; p < pipe_; ++p) {
      for (int lane = 0; lane < num_lanes_; ++lane) {
        const Piece in = piece(received_block(lane, step), lane, p);
        if (in.num_bytes == 0) continue;
        // The lane's receive comes from the rank that sends to us on it.
        const int from = peer_to_[1 - lane];
        recvs_[recv_index(lane, step, p)] = comm_.irecv(from, tags_[lane], in.data, in.num_bytes);
      }
    }
  }
  // Step 0 sends this rank's own block: nothing to wait for.
  for (std::int64_t p = 0; p < pipe_; ++p) {
    for (int lane = 0; lane < num_lanes_; ++lane) {
      const Piece out = piece(sent_block(lane, 0), lane, p);
      if (out.num_bytes == 0) continue;
      sends_[lane].push_back(comm_.isend(peer_to_[lane], tags_[lane], out.data, out.num_bytes));
    }
  }
}

void RingAllGather::forward(int lane, int step, Deadline deadline) {
  for (std::int64_t p = 0; p < pipe_; ++p) {
    const Piece out = piece(sent_block(lane, step), lane, p);
    if (out.num_bytes == 0) continue;
    // Store and forward: piece p of step s is piece p received at s-1.
    recvs_[recv_index(lane, step - 1, p)]->wait_until(deadline);
    sends_[lane].push_back(comm_.isend(peer_to_[lane], tags_[lane], out.data, out.num_bytes));
  }
}

void RingAllGather::complete_lane(int lane, Deadline deadline) {
  for (int step = 0; step < num_steps_; ++step) {
    for (std::int64_t p = 0; p < pipe_; ++p) {
      const auto& request = recvs_[recv_index(lane, step, p)];
      if (request) request->wait_until(deadline);
    }
  }
  for (auto& request : sends_[lane]) request->wait_until(deadline);
}

void RingAllGather::finish(Deadline deadline) {
  if (num_ranks_ == 1) return;
  collective_fault_point(comm_);  // step 0's messages are in flight
  if (num_lanes_ == 2 && num_steps_ > 1 && comm_.collective_clocks() != nullptr) {
    // Modelled time: the counter-clockwise lane on a clock of its own
    // (comm/forked_part.h), so neither lane waits for the other's arrivals.
    ForkedPart counter_clockwise(comm_, "ring counter-clockwise lane", [this, deadline] {
      for (int step = 1; step < num_steps_; ++step) forward(1, step, deadline);
      complete_lane(1, deadline);
    });
    forked_lane_clock_ = counter_clockwise.clock();
    for (int step = 1; step < num_steps_; ++step) forward(0, step, deadline);
    complete_lane(0, deadline);
    counter_clockwise.join();
    return;
  }
  // Wall time: both lanes from this thread, step by step, so both
  // directions of every link stay busy.
  for (int step = 1; step < num_steps_; ++step) {
    for (int lane = 0; lane < num_lanes_; ++lane) forward(lane, step, deadline);
  }
  for (int lane = 0; lane < num_lanes_; ++lane) complete_lane(lane, deadline);
}

void ring_all_gather_blocks(Communicator& comm, const BlockLayout& layout, std::size_t element_size_bytes,
                            std::byte* output, bool bidirectional, std::int64_t pipe, CollectiveKind kind,
                            std::uint32_t collective_tag, Deadline deadline) {
  RingAllGather gather(comm, layout, element_size_bytes, output, bidirectional, pipe, kind, collective_tag);
  gather.start();
  gather.finish(deadline);
}

void ring_reduce_scatter_blocks(Communicator& comm, const BlockLayout& layout, DType dtype, DType wire_dtype,
                                const std::byte* input, std::byte* output, bool bidirectional, CollectiveKind kind,
                                std::uint32_t collective_tag, Deadline deadline) {
  EPMOE_CHECK(dtype == DType::f32 || dtype == DType::bf16);
  EPMOE_CHECK(wire_dtype == DType::f32 || wire_dtype == DType::bf16);
  // A bf16 wire rounds what crosses a link and nothing else: each rank adds
  // its contribution to the f32 value of the bf16 it received, in f32, and
  // rounds that sum once to send it on; the last rank's sum is not rounded
  // (for an f32 output). Rounding the partials held in memory as well would
  // add nothing to the bytes saved and could only add error.
  const bool bf16_wire = wire_dtype == DType::bf16;
  const std::int64_t wire_esize = bf16_wire ? 2 : 4;
  const int num_ranks = comm.size();
  const int rank = comm.rank();
  const std::size_t esize = dtype_size_bytes(dtype);
  const bool is_f32 = dtype == DType::f32;

  // Element i of block b of this rank's input, as f32.
  auto input_value = [&](int block, std::int64_t i) {
    const std::byte* base = input + (layout.offset[block] + i) * esize;
    if (is_f32) {
      float value;
      std::memcpy(&value, base, sizeof(value));
      return value;
    }
    std::uint16_t bits;
    std::memcpy(&bits, base, sizeof(bits));
    return bf16_to_f32(bits);
  };
  if (num_ranks == 1) {  // the block itself, bit for bit (output may alias it)
    if (layout.num_elements[0] > 0) {
      std::memmove(output, input + layout.offset[0] * esize, layout.num_elements[0] * esize);
    }
    return;
  }

  // One lane per direction: lane 0 sends to rank+1 and reduces the first
  // ceil(n/2) elements of every block, lane 1 sends to rank-1 and reduces the
  // rest (split_lanes). A lane running in direction d receives at step s the
  // partial sum of block rank - d*(s+2) from rank-d, adds this rank's
  // contribution and sends it on at step s+1; step 0 sends this rank's own
  // block rank-d as f32. At the last step the block received is this rank's.
  struct Lane {
    int direction;
    transport::Tag tag;
    float* partials[2];  // received partial sums, alternating by step
    // bf16 wire: what arrives (alternating by step) and what leaves.
    std::uint16_t* wire_in[2];
    std::uint16_t* wire_out;
    std::unique_ptr<Request> send;
    std::unique_ptr<Request> recv;
  };
  const int num_lanes = bidirectional ? 2 : 1;
  std::int64_t max_block = 0;
  for (std::int64_t n : layout.num_elements) max_block = std::max(max_block, n);
  Lane lanes[2] = {{+1,
                    make_tag(kind, collective_tag, Slot::reduce),
                    {nullptr, nullptr},
                    {nullptr, nullptr},
                    nullptr,
                    nullptr,
                    nullptr},
                   {-1,
                    make_tag(kind, collective_tag, Slot::reduce_counter_clockwise),
                    {nullptr, nullptr},
                    {nullptr, nullptr},
                    nullptr,
                    nullptr,
                    nullptr}};
  // Where lane `l` of block `b` sits inside the block.
  auto lane_begin = [&](int l, int b) { return split_lanes(layout.num_elements[b], bidirectional).lane_begin[l]; };
  auto lane_size = [&](int l, int b) { return split_lanes(layout.num_elements[b], bidirectional).lane_size[l]; };
  auto lane_bytes = [&](int l, int b) { return lane_size(l, b) * wire_esize; };
  // Where lane `lane` receives step `step`'s partial sum.
  auto recv_target = [&](const Lane& lane, int step) -> void* {
    return bf16_wire ? static_cast<void*>(lane.wire_in[step % 2]) : static_cast<void*>(lane.partials[step % 2]);
  };
  // What a lane sends of `count` f32 values: on a bf16 wire its send buffer
  // (the previous send from it has completed), filled and charged here.
  auto to_wire = [&](const Lane& lane, const float* values, std::int64_t count) {
    if (!bf16_wire) return static_cast<const void*>(values);
    charge_wire_conversion("reduce_scatter to bf16", count, [&] {
      for (std::int64_t i = 0; i < count; ++i) lane.wire_out[i] = f32_to_bf16(values[i]);
    });
    return static_cast<const void*>(lane.wire_out);
  };
  auto received_block = [&](const Lane& lane, int step) { return wrap(rank - lane.direction * (step + 2), num_ranks); };

  for (int l = 0; l < num_lanes; ++l) {
    Lane& lane = lanes[l];
    lane.partials[0] = scratch(3 * l, max_block).data();
    lane.partials[1] = scratch(3 * l + 1, max_block).data();
    if (bf16_wire) {
      lane.wire_in[0] = wire_scratch(3 * l, max_block).data();
      lane.wire_in[1] = wire_scratch(3 * l + 1, max_block).data();
      lane.wire_out = wire_scratch(3 * l + 2, max_block).data();
    }
    const int first_block = wrap(rank - lane.direction, num_ranks);
    const std::int64_t begin = lane_begin(l, first_block);
    const std::int64_t count = lane_size(l, first_block);
    const float* first_values;
    if (is_f32) {
      first_values = reinterpret_cast<const float*>(input) + layout.offset[first_block] + begin;
    } else {
      float* converted = scratch(3 * l + 2, count).data();
      for (std::int64_t i = 0; i < count; ++i) converted[i] = input_value(first_block, begin + i);
      first_values = converted;
    }
    const void* first_send = to_wire(lane, first_values, count);
    const int next = wrap(rank + lane.direction, num_ranks);
    const int prev = wrap(rank - lane.direction, num_ranks);
    lane.send = comm.isend(next, lane.tag, first_send, lane_bytes(l, first_block));
    lane.recv = comm.irecv(prev, lane.tag, recv_target(lane, 0), lane_bytes(l, received_block(lane, 0)));
  }
  collective_fault_point(comm);  // the first partial sums are in flight

  const int num_steps = num_ranks - 1;
  for (int step = 0; step < num_steps; ++step) {
    for (int l = 0; l < num_lanes; ++l) {
      Lane& lane = lanes[l];
      lane.recv->wait_until(deadline);
      float* partial = lane.partials[step % 2];
      const int block = received_block(lane, step);
      const std::int64_t begin = lane_begin(l, block);
      const std::int64_t count = lane_size(l, block);
      if (bf16_wire) {
        const std::uint16_t* arrived = lane.wire_in[step % 2];
        charge_wire_conversion("reduce_scatter from bf16", count, [&] {
          for (std::int64_t i = 0; i < count; ++i) partial[i] = bf16_to_f32(arrived[i]);
        });
      }
      if (step == num_steps - 1) {  // this rank's block: sum = partial + own, rounded once
        EPMOE_CHECK_EQ(block, rank);
        for (std::int64_t i = 0; i < count; ++i) {
          const float sum = partial[i] + input_value(rank, begin + i);
          if (is_f32) {
            std::memcpy(output + (begin + i) * esize, &sum, sizeof(sum));
          } else {
            const std::uint16_t bits = f32_to_bf16(sum);
            std::memcpy(output + (begin + i) * esize, &bits, sizeof(bits));
          }
        }
        continue;
      }
      if (is_f32) {  // the hot loop: plain floats so that it vectorises
        const float* own = reinterpret_cast<const float*>(input) + layout.offset[block] + begin;
        for (std::int64_t i = 0; i < count; ++i) partial[i] += own[i];
      } else {
        for (std::int64_t i = 0; i < count; ++i) partial[i] += input_value(block, begin + i);
      }
      // The other buffer is the one the previous send reads from.
      lane.send->wait_until(deadline);
      const int next = wrap(rank + lane.direction, num_ranks);
      const int prev = wrap(rank - lane.direction, num_ranks);
      lane.recv =
          comm.irecv(prev, lane.tag, recv_target(lane, step + 1), lane_bytes(l, received_block(lane, step + 1)));
      lane.send = comm.isend(next, lane.tag, to_wire(lane, partial, count), lane_bytes(l, block));
    }
  }
  for (int l = 0; l < num_lanes; ++l) lanes[l].send->wait_until(deadline);
}

}  // namespace epmoe::comm::detail
