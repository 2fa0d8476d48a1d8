#include "model/gradient_reduction.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "comm/all_gather.h"
#include "comm/reduce_scatter.h"
#include "core/error.h"

namespace epmoe {

struct GradientReduction::Bucket {
  std::vector<float> staging;     // padded reduce-scatter input; empty: the bucket is summed in place
  std::vector<float> summed;      // this rank's padded block of sums
  comm::CollectiveHandle handle;  // declared last: waited for before the buffers go
};

GradientReduction::GradientReduction(transport::Communicator& comm, std::span<float> flat, std::uint32_t first_tag,
                                     std::chrono::milliseconds timeout)
    : comm_(comm),
      flat_(flat),
      first_tag_(first_tag),
      timeout_(timeout),
      pending_end_(static_cast<std::int64_t>(flat.size())),
      ready_begin_(pending_end_) {
  // comm::detail::BlockLayout::split, as comm::all_reduce lays out the whole
  // buffer, and split_lanes' clockwise share ceil(n / 2).
  const int num_ranks = comm_.size();
  const auto n = static_cast<std::int64_t>(flat.size());
  std::int64_t offset = 0;
  for (int r = 0; r < num_ranks; ++r) {
    const std::int64_t count = n / num_ranks + (r < n % num_ranks ? 1 : 0);
    block_begin_.push_back(offset);
    half_.push_back(offset + (count + 1) / 2);
    offset += count;
  }
  block_begin_.push_back(offset);
}

GradientReduction::~GradientReduction() = default;

void GradientReduction::ready(std::int64_t begin) {
  EPMOE_CHECK(begin >= 0 && begin <= ready_begin_);
  ready_begin_ = begin;
  const int num_ranks = comm_.size();
  if (num_ranks == 1) return;  // the buffer is its own sum
  std::int64_t cut = begin;
  if (begin > 0) {
    // Hold back what is left for the last bucket rather than run out of tags.
    if (buckets_started() + 1 >= kMaxBuckets) return;
    if (num_ranks >= 4) cut = *std::lower_bound(block_begin_.begin(), block_begin_.end(), begin);
  }
  if (cut < pending_end_) {
    start(cut, pending_end_);
    pending_end_ = cut;
  }
}

void GradientReduction::start(std::int64_t begin, std::int64_t end) {
  EPMOE_CHECK(begin >= 0 && begin < end && end <= static_cast<std::int64_t>(flat_.size()));
  const int num_ranks = comm_.size(), rank = comm_.rank();
  if (num_ranks == 1) return;
  EPMOE_CHECK(buckets_started() < kMaxBuckets);
  // Block b of the bucket: its elements in the whole buffer's block b, in
  // its clockwise half (c) and its counter-clockwise half (d). The
  // reduce-scatter sends p + q of them, the first ceil((p + q) / 2) = p
  // clockwise; for R <= 3 the halves sum alike and p = c, q = d.
  std::vector<std::int64_t> c(num_ranks), d(num_ranks), p(num_ranks), q(num_ranks), real(num_ranks);
  bool padded = false;
  for (int b = 0; b < num_ranks; ++b) {
    const auto overlap = [&](std::int64_t lo, std::int64_t hi) {
      return std::max<std::int64_t>(0, std::min(end, hi) - std::max(begin, lo));
    };
    c[b] = overlap(block_begin_[b], half_[b]);
    d[b] = overlap(half_[b], block_begin_[b + 1]);
    p[b] = c[b];
    q[b] = d[b];
    if (num_ranks >= 4 && p[b] != (p[b] + q[b] + 1) / 2) {
      if (c[b] > d[b]) {
        q[b] = c[b] - 1;
      } else {
        p[b] = d[b];
        q[b] = d[b];
      }
      padded = true;
    }
    real[b] = c[b] + d[b];
  }
  std::vector<std::int64_t> counts(num_ranks);
  std::int64_t own_offset = 0, sent = 0;  // own_offset: this rank's summed block inside the bucket
  for (int b = 0; b < num_ranks; ++b) {
    counts[b] = p[b] + q[b];
    sent += counts[b] + real[b];
    if (b < rank) own_offset += real[b];
  }
  elements_moved_ += static_cast<std::int64_t>(num_ranks - 1) * sent;

  auto bucket = std::make_unique<Bucket>();
  float* const data = flat_.data() + begin;
  if (padded) {
    bucket->staging.assign(static_cast<std::size_t>(std::accumulate(counts.begin(), counts.end(), std::int64_t{0})),
                           0.0f);
  }
  const std::uint32_t tag = first_tag_ + static_cast<std::uint32_t>(buckets_.size());
  Bucket* const state = bucket.get();
  bucket->handle = comm::launch_collective(
      comm_,
      "gradient bucket " + std::to_string(buckets_.size()) + " [" + std::to_string(begin) + ", " + std::to_string(end) +
          ")",
      timeout_,
      [&comm = comm_, state, data, rank, padded, tag, counts = std::move(counts), real, c, d, p,
       own_offset](transport::Deadline deadline) {
        // The inner collectives share the bucket's deadline.
        const auto remaining = [&] {
          return std::max(std::chrono::milliseconds(1),
                          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - transport::Clock::now()));
        };
        const std::size_t num_ranks = counts.size();
        const float* input = data;
        float* own = data + own_offset;
        if (padded) {
          std::int64_t at = 0, from = 0;
          for (std::size_t b = 0; b < num_ranks; ++b) {
            std::copy(data + from, data + from + c[b], state->staging.begin() + at);
            std::copy(data + from + c[b], data + from + real[b], state->staging.begin() + at + p[b]);
            at += counts[b];
            from += real[b];
          }
          state->summed.resize(static_cast<std::size_t>(counts[rank]));
          input = state->staging.data();
        }
        float* const output = padded ? state->summed.data() : own;
        comm::reduce_scatter(comm, {.input = input,
                                    .output = output,
                                    .num_elements_per_rank = counts,
                                    .dtype = DType::f32,
                                    .tag = tag,
                                    .timeout = remaining()})
            .wait();
        if (padded) {
          std::copy(output, output + c[rank], own);
          std::copy(output + p[rank], output + p[rank] + d[rank], own + c[rank]);
        }
        comm::ring_all_gather(comm, {.input = own,
                                     .output = data,
                                     .num_elements_by_rank = real,
                                     .dtype = DType::f32,
                                     .tag = tag,
                                     .timeout = remaining()})
            .wait();
      });
  buckets_.push_back(std::move(bucket));
}

void GradientReduction::wait() {
  for (const std::unique_ptr<Bucket>& bucket : buckets_) bucket->handle.wait();
}

}  // namespace epmoe
