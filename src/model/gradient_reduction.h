// GradientReduction: the sum over ranks of the trainer's flat buffer of
// replicated gradients, started bucket by bucket while the backward still
// runs (DESIGN.md §4.9; issue 15), with every element's result bit-equal to
// one comm::all_reduce of the whole buffer after the backward.
//
// Why the bits need care: the ring all-reduce (comm/all_reduce.h, comm/
// ring.h) sums element i in an order fixed by where i falls in the buffer -
// which of the R near-equal blocks (b) and which half of that block (the
// clockwise or the counter-clockwise lane):
//   clockwise half of block b:         ((x_{b+1} + x_{b+2}) + ...) + x_b
//   counter-clockwise half of block b: ((x_{b-1} + x_{b-2}) + ...) + x_b
// An all-reduce of a sub-range lays out its own blocks, so in general it sums
// an element in another order (other rounding). Float addition is
// commutative, so the two halves' orders are the same for R <= 3 (R = 2:
// x_{b+1} + x_b either way; R = 3: (x_{b+1} + x_{b+2}) + x_b and (x_{b+2} +
// x_{b+1}) + x_b) and only the block matters; from R = 4 on the half matters
// too.
//
// So a bucket [begin, end) of the flat buffer is summed by a reduce-scatter
// whose block b holds exactly the bucket's elements of the whole buffer's
// block b (comm/reduce_scatter.h takes per-rank counts and sums block b in
// the same order), followed by an all-gather of the summed blocks in place.
// From R = 4 on, the reduce-scatter's own clockwise/counter-clockwise split
// of block b must fall where the whole buffer's does: when the bucket holds
// a different share of the two halves, the shorter one is padded with zeros
// in a staging copy (the padding is summed and dropped, touching no real
// element). Bytes: without padding a bucket moves what its share of the one
// all-reduce did (each block crosses R-1 links twice), so the buckets
// together move exactly 2(R-1)S for S bytes; the trainer's bucket policy
// (ready()) chooses buckets that need no padding.
//
// Every rank must start the same buckets in the same order (the tags are the
// bucket's index from first_tag); any rank may be at any point of its
// backward meanwhile. A failure inside a bucket reaches every rank through
// the collectives' abort (comm/collective_handle.h); an exception on this
// rank with buckets in flight destroys them, which cancels this rank's
// pending waits.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/collective_handle.h"
#include "transport/communicator.h"

namespace epmoe {

class GradientReduction {
 public:
  // At most this many buckets per reduction (collective tags first_tag ..
  // first_tag + kMaxBuckets - 1, used by a reduce-scatter and an all-gather
  // each); ready() holds the rest back for the last bucket.
  static constexpr int kMaxBuckets = 512;

  // `flat` (not owned) is the buffer every rank sums, the same length on
  // every rank; it must outlive this object.
  GradientReduction(transport::Communicator& comm, std::span<float> flat, std::uint32_t first_tag,
                    std::chrono::milliseconds timeout);
  ~GradientReduction();  // waits for (or, while an exception unwinds, cancels) buckets in flight
  GradientReduction(const GradientReduction&) = delete;
  GradientReduction& operator=(const GradientReduction&) = delete;

  // The backward's policy: flat[begin, the previous ready() begin (initially
  // the end)) now holds this rank's gradients; the caller fills the buffer
  // from its end towards its start, as the backward finishes parameters in
  // the reverse of their order in it. Starts a bucket of what is ready when
  // that costs no padding: for R <= 3 everything ready; from R = 4 on the
  // whole blocks of the one all-reduce's layout that are ready (so a bucket
  // never splits a block: fewer, larger buckets, no padding).
  void ready(std::int64_t begin);

  // Starts the sum of flat[begin, end) (a range no bucket has held). Any
  // range is allowed (padding as needed); ready() calls it.
  void start(std::int64_t begin, std::int64_t end);

  // Waits for every bucket started; afterwards flat holds the sums of the
  // ranges started (the whole buffer once ready(0) was called).
  void wait();

  int buckets_started() const { return static_cast<int>(buckets_.size()); }
  // Elements this rank's buckets sent through the rings so far, over all
  // ranks, counting padding: reduce-scatter and all-gather each move every
  // element across R-1 links. 2(R-1) * the buffer's length when no bucket
  // was padded.
  std::int64_t elements_moved_over_all_ranks() const { return elements_moved_; }

 private:
  struct Bucket;
  transport::Communicator& comm_;
  std::span<float> flat_;
  std::uint32_t first_tag_;
  std::chrono::milliseconds timeout_;
  // The one all-reduce's layout: block b is [block_begin_[b], block_begin_[b
  // + 1]), its clockwise half ends at half_[b].
  std::vector<std::int64_t> block_begin_, half_;
  std::int64_t pending_end_;  // flat[pending_end_, end) is in buckets already
  std::int64_t ready_begin_;  // flat[ready_begin_, end) holds this rank's gradients
  std::int64_t elements_moved_ = 0;
  std::vector<std::unique_ptr<Bucket>> buckets_;
};

}  // namespace epmoe
