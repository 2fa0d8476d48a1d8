// The two ring algorithms, as blocking functions run on a progress thread
// (internal to comm/; the public entry points are all_gather.h,
// reduce_scatter.h and all_reduce.h). Blocks are per-rank slices of one
// buffer in rank order; their sizes may differ (all_reduce splits n elements
// into R blocks that differ by one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/modelled_clock.h"

#include <epmoe/dtype.h>

#include "comm/tag.h"
#include "transport/communicator.h"

namespace epmoe::comm::detail {

// Block r holds num_elements[r] elements starting at element offset[r].
struct BlockLayout {
  std::vector<std::int64_t> num_elements;  // [rank]
  std::vector<std::int64_t> offset;        // [rank], in elements

  static BlockLayout equal(int num_ranks, std::int64_t num_elements_per_rank);
  // n elements in R blocks of n / R, the first n % R of them one longer.
  static BlockLayout split(int num_ranks, std::int64_t num_elements);
  std::int64_t total() const;
};

// How a block is cut into ring messages: lanes[0] goes clockwise (to rank+1),
// lanes[1] counter-clockwise (to rank-1). Bidirectional: the clockwise lane
// takes the first ceil(n/2) elements, the other the rest - an odd count is
// split one element unevenly rather than sent one way, so only a block of 1
// element travels in one direction. Each lane is cut into `pipe` pieces on
// element boundaries (empty pieces are never sent).
struct LaneSplit {
  std::int64_t lane_begin[2];  // element offsets inside the block
  std::int64_t lane_size[2];
};
LaneSplit split_lanes(std::int64_t num_elements, bool bidirectional);

// output holds every block in rank order and already holds this rank's block;
// afterwards it holds all blocks. Store-and-forward (DESIGN.md §4.4): at step
// s a lane forwards the block it received at step s-1, piece by piece.
//
// In two parts, so that the first can run on the caller's thread
// (launch_collective's prologue, comm/collective_handle.h): start() posts
// every receive and step 0's sends (this rank's own block) and never waits;
// finish() forwards steps 1..R-2 as their pieces arrive and waits for
// everything. At R=2 start() is all the work a core is needed for. In
// modelled time the two lanes forward on clocks of their own
// (comm/forked_part.h): each lane's step s leaves when that lane's step
// s-1 arrived, whatever the other lane does.
class RingAllGather {
 public:
  RingAllGather(transport::Communicator& comm, BlockLayout layout, std::size_t element_size_bytes, std::byte* output,
                bool bidirectional, std::int64_t pipe, CollectiveKind kind, std::uint32_t collective_tag);
  void start();
  void finish(transport::Deadline deadline);  // after start(), on any one thread

 private:
  struct Piece {
    std::byte* data;
    std::int64_t num_bytes;
  };
  Piece piece(int block, int lane, std::int64_t p) const;
  int sent_block(int lane, int step) const;
  int received_block(int lane, int step) const;
  std::size_t recv_index(int lane, int step, std::int64_t p) const;
  // Forwards lane's pieces of `step` (>= 1) as those of step-1 arrive.
  void forward(int lane, int step, transport::Deadline deadline);
  // Waits for every receive and send of the lane.
  void complete_lane(int lane, transport::Deadline deadline);

  transport::Communicator& comm_;
  BlockLayout layout_;
  std::int64_t esize_;
  std::byte* output_;
  bool bidirectional_;
  std::int64_t pipe_;
  int num_ranks_, rank_, num_steps_, num_lanes_;
  int peer_to_[2];
  transport::Tag tags_[2];
  // Modelled time: the forked lane's clock, declared before the requests so
  // that it outlives them (ForkedPart::clock()).
  std::shared_ptr<ModelledClock> forked_lane_clock_;
  std::vector<std::unique_ptr<transport::Request>> recvs_;
  std::vector<std::unique_ptr<transport::Request>> sends_[2];  // [lane]: each lane's own (modelled time: own thread)
};

// Both parts at once, on the calling thread.
void ring_all_gather_blocks(transport::Communicator& comm, const BlockLayout& layout, std::size_t element_size_bytes,
                            std::byte* output, bool bidirectional, std::int64_t pipe, CollectiveKind kind,
                            std::uint32_t collective_tag, transport::Deadline deadline);

// Sums block b of every rank's input into output (this rank's block), for
// dtype f32 or bf16; partial sums travel as wire_dtype (f32 or bf16) and are
// accumulated in f32 at every rank. Bidirectional: the first
// ceil(n/2) elements of a block (split_lanes) are reduced clockwise, the rest
// counter-clockwise, each half crossing R-1 links as in the all-gather.
// Summation order is fixed, per lane: element i of block b is accumulated
// starting with the contribution of rank b+d, then b+2d, ... around the ring,
// ending with rank b's own, d = +1 on the clockwise lane, -1 on the other:
//   out_b[i] = ((x_{b+d}[i] + x_{b+2d}[i]) + ...) + x_b[i]      (ranks mod R)
// so results are identical run to run and independent of timing and threads.
// `output` may alias this rank's block inside `input`. In modelled time a
// bf16 wire's conversions (f32 to bf16 before each send, bf16 to f32 after
// each receive: 6 bytes a value) are charged at the memory rate on the
// collective's clock, so they delay its steps, and traced on the rank's
// collective lanes as "reduce_scatter to bf16" / "reduce_scatter from bf16";
// the f32 sums themselves are not charged (nor are they for an f32 wire).
void ring_reduce_scatter_blocks(transport::Communicator& comm, const BlockLayout& layout, DType dtype, DType wire_dtype,
                                const std::byte* input, std::byte* output, bool bidirectional, CollectiveKind kind,
                                std::uint32_t collective_tag, transport::Deadline deadline);

}  // namespace epmoe::comm::detail
