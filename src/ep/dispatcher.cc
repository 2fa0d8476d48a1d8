#include "ep/dispatcher.h"

#include <algorithm>
#include <span>
#include <utility>

#include "core/error.h"
#include "ep/alltoall_dispatcher.h"
#include "ep/collective_tags.h"
#include "ep/ring_dispatcher.h"
#include "kernels/convert.h"
#include "transport/communicator.h"

namespace epmoe::ep {

void reset_stats(DispatchStats& stats, int num_local_experts) {
  stats.bytes_sent.clear();
  stats.rows_per_local_expert.assign(static_cast<std::size_t>(num_local_experts), 0);
  stats.dropped_pairs = 0;
}

void count_rows(DispatchStats& stats, const ExpertRows& rows, int num_local_experts) {
  for (int e = 0; e < num_local_experts; ++e) stats.rows_per_local_expert[e] += rows.group_sizes[e];
}

ChunkRange chunk_range(std::int64_t num_tokens, int num_chunks, int chunk) {
  EPMOE_CHECK(chunk >= 0 && chunk < num_chunks);
  return {num_tokens * chunk / num_chunks, num_tokens * (chunk + 1) / num_chunks};
}

Dispatcher::Dispatcher(transport::Communicator* comm, const EpConfig& config, int num_ranks, int rank)
    : comm_(comm),
      config_((config.validate(num_ranks), config)),
      num_ranks_(num_ranks),
      rank_(rank),
      num_local_experts_(config.num_experts / num_ranks),
      experts_per_rank_(num_local_experts_ + (config.replicas_enabled() ? config.redundant_slots : 0)),
      codec_(config.token_format, config.hidden),
      slot_in_use_(static_cast<std::size_t>(kEpGroupMaxStepsInFlight), false) {
  EPMOE_CHECK(rank >= 0 && rank < num_ranks);
  EPMOE_CHECK(comm != nullptr || num_ranks == 1);
}

Dispatcher::~Dispatcher() = default;

DispatchHandle Dispatcher::start_step(int num_chunks) {
  EPMOE_CHECK(num_chunks >= 1 && num_chunks <= 64);
  // The next block in call order: every rank starts the same steps in the
  // same order, so every rank picks the same block without a message.
  const int slot = next_slot_;
  if (slot_in_use_[static_cast<std::size_t>(slot)]) {
    throw UsageError("EP group: more than " + std::to_string(kEpGroupMaxStepsInFlight) +
                     " steps in flight (each layer's forward holds one until its backward ends or the step is "
                     "destroyed); finish or drop earlier steps first");
  }
  std::unique_ptr<StepState> state = take_step_state(num_chunks);
  state->tag_base = config_.tag_base + 1024u * static_cast<std::uint32_t>(slot);
  slot_in_use_[static_cast<std::size_t>(slot)] = true;
  next_slot_ = (slot + 1) % kEpGroupMaxStepsInFlight;
  ++steps_in_flight_;
  return DispatchHandle(*this, std::move(state), slot);
}

std::unique_ptr<StepState> Dispatcher::take_step_state(int num_chunks) {
  std::unique_ptr<StepState> state;
  if (free_steps_.empty()) {
    state = make_step_state();
  } else {
    state = std::move(free_steps_.back());
    free_steps_.pop_back();
  }
  state->num_chunks = num_chunks;
  return state;
}

void Dispatcher::return_step_state(std::unique_ptr<StepState> state, int slot, bool reusable) noexcept {
  slot_in_use_[static_cast<std::size_t>(slot)] = false;
  --steps_in_flight_;
  if (state == nullptr) return;
  pooled_bytes_ -= state->counted_bytes;
  if (reusable) {
    state->counted_bytes = state->capacity_bytes();
    pooled_bytes_ += state->counted_bytes;
    state->x = state->dy = {};
    free_steps_.push_back(std::move(state));
  }
  // else: destroyed here, its collectives waited for (ep/dispatch_handle.cc)
  recharge();
}

PhaseBuffers* Dispatcher::take_phase_buffers() {
  for (const auto& buffers : buffers_) {
    if (!buffers->in_use) {
      buffers->in_use = true;
      return buffers.get();
    }
  }
  buffers_.push_back(make_phase_buffers());
  buffers_.back()->in_use = true;
  return buffers_.back().get();
}

void Dispatcher::return_phase_buffers(PhaseBuffers* buffers) noexcept {
  EPMOE_DCHECK(buffers->in_use);
  buffers->in_use = false;
  pooled_bytes_ -= buffers->counted_bytes;
  buffers->counted_bytes = buffers->capacity_bytes();
  pooled_bytes_ += buffers->counted_bytes;
  recharge();
}

void Dispatcher::charge_buffers_to(MemoryLedger* ledger) {
  charge_ = LedgerCharge(ledger, "buffer/dispatch", pooled_bytes_);
}

void Dispatcher::recharge() noexcept { charge_.resize(pooled_bytes_); }

void Dispatcher::start_tensor_scales(StepState& step) const {
  // R-1 blocks of num_chunks f32 maxima leave this rank.
  std::vector<std::int64_t> chunk_begin;
  for (int c = 0; c <= step.num_chunks; ++c) chunk_begin.push_back(step.num_tokens * c / step.num_chunks);
  step.tensor_scales.start(*comm_, step.x.data<float>(), config_.hidden, std::move(chunk_begin),
                           ep_tag(step.tag_base, 0, EpOp::forward_scale), config_.timeout);
  step.stats.bytes_sent["forward/ring_all_gather fp8 scale"] += 4 * step.num_chunks * (num_ranks_ - 1);
}

void Dispatcher::count_bytes(StepState& step, const std::string& name, const std::vector<std::int64_t>& counts,
                             std::int64_t element_bytes) const {
  std::int64_t bytes = 0;
  for (int r = 0; r < num_ranks_; ++r)
    if (r != rank_) bytes += counts[r] * element_bytes;
  step.stats.bytes_sent[name] += bytes;
}

void Dispatcher::to_wire(const float* values, std::int64_t num_values, std::vector<bf16_t>& wire) {
  wire.resize(static_cast<std::size_t>(num_values));
  convert(std::span<const float>(values, wire.size()), std::span<bf16_t>(wire));
}

void Dispatcher::from_wire(const std::vector<bf16_t>& wire, float* values) {
  convert(std::span<const bf16_t>(wire), std::span<float>(values, wire.size()));
}

std::unique_ptr<Dispatcher> make_dispatcher(transport::Communicator& comm, const EpConfig& config) {
  if (config.dispatch == DispatchKind::ring) return std::make_unique<RingDispatcher>(comm, config);
  return std::make_unique<AllToAllDispatcher>(comm, config);
}

}  // namespace epmoe::ep
