// Dispatcher: one rank's side of expert-parallel token movement (DESIGN.md
// §4.5, §4.6), as DeepEP's Buffer is: per rank (not per layer), it holds the
// communicator, the configuration, the token codec and the memory every
// step reuses - a pool of step layouts and a pool of exchange buffers, each
// kept at its high-water mark and shared by every layer that runs on it.
// What one step owns lives in its DispatchHandle (ep/dispatch_handle.h):
// start_step() returns a handle, and the handle drives the step through the
// dispatcher's transfer primitives below, in the one chunk pipeline it
// implements. A dispatcher has no step state of its own, so any number of
// steps (every layer's, or two micro-batches of one layer) may be in flight
// at once, each with its own block of tags.
//
// Concrete dispatchers: AllToAllDispatcher (ragged all-to-all, dedup,
// capacity), RingDispatcher (ring of experts) and LocalDispatcher (one rank
// holds every expert; no communication).
//
// Threads: a dispatcher and its handles belong to their rank's thread (the
// pools are not locked); the collectives they start run on progress threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <epmoe/config.h>

#include "core/memory_ledger.h"
#include "core/tensor.h"
#include "ep/dispatch_handle.h"
#include "ep/expert_rows.h"
#include "ep/step_state.h"
#include "ep/token_codec.h"
#include "transport/communicator.h"

namespace epmoe::ep {

class Dispatcher {
 public:
  virtual ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  const EpConfig& config() const { return config_; }
  int num_ranks() const { return num_ranks_; }
  int rank() const { return rank_; }
  int num_local_experts() const { return num_local_experts_; }  // E_l
  int first_local_expert() const { return rank_ * num_local_experts_; }
  // Experts a rank computes: E_l homes, then B replica slots when the config
  // has replicas. A routing destination (ep/step_state.h) is
  // rank * experts_per_rank() + local index.
  int experts_per_rank() const { return experts_per_rank_; }

  // A new step of `num_chunks` chunks (no communication): its handle takes a
  // layout from the pool and the next free block of tags. Every rank must
  // start its steps in the same order (as with any collective). UsageError
  // when kEpGroupMaxStepsInFlight steps are in flight already.
  DispatchHandle start_step(int num_chunks);

  // Charges the pools (layouts and exchange buffers, at their capacity) to
  // `ledger` under "buffer/dispatch" (not owned; null: none); updated as a
  // phase returns its buffers.
  void charge_buffers_to(MemoryLedger* ledger);
  // Bytes the pools keep across steps (as charged).
  std::int64_t buffer_bytes() const { return pooled_bytes_; }
  int steps_in_flight() const { return steps_in_flight_; }

 protected:
  // `comm` may be null for a LocalDispatcher (one rank, no communication).
  Dispatcher(transport::Communicator* comm, const EpConfig& config, int num_ranks, int rank);

  // The transfer primitives a handle calls, in the order its pipeline
  // guarantees (ep/dispatch_handle.cc). A chunk's layout is planned by the
  // forward's start_dispatch and read by everything after it; a remat
  // start_dispatch / collect_rows re-sends the same rows with that layout.
  friend class DispatchHandle;
  virtual std::unique_ptr<StepState> make_step_state() const = 0;
  virtual std::unique_ptr<PhaseBuffers> make_phase_buffers() const = 0;
  // Step-level metadata (token counts, fp8 scales): may communicate.
  virtual void begin_step(StepState& step, const RoutingView& routing) = 0;
  virtual void start_dispatch(StepState& step, int chunk, bool remat) = 0;
  virtual ExpertRows collect_rows(StepState& step, int chunk, bool remat) = 0;
  virtual void start_combine(StepState& step, int chunk, Tensor slot_outputs) = 0;  // [num_slots, H]
  // Writes the chunk's rows of y [N_l, H] (every element of them).
  virtual void finish_combine(StepState& step, int chunk, float* y) = 0;
  virtual void start_cotangents(StepState& step, int chunk) = 0;
  virtual Tensor collect_cotangents(StepState& step, int chunk) = 0;  // [num_slots, H]
  virtual void start_gradients(StepState& step, int chunk, Tensor slot_dx, std::vector<float> row_dweights) = 0;
  // Writes the chunk's rows of dx [N_l, H] and d_topk_weights [N_l, K].
  virtual void finish_gradients(StepState& step, int chunk, float* dx, float* d_topk_weights) = 0;

  transport::Communicator& comm() const { return *comm_; }
  // fp8_tokens=tensor: every chunk's scale in one all-gather started at the
  // step's dispatch (the handle's), moving while the step plans; the
  // dispatchers read step.tensor_scales.scale(c) when they send chunk c.
  void start_tensor_scales(StepState& step) const;
  const TokenCodec& codec() const { return codec_; }
  // How combine outputs, dy rows and dx travel (key wire_dtype): the dtype
  // the exchange moves and its bytes per element.
  bool bf16_wire() const { return config_.wire_dtype == WireDType::bf16; }
  DType wire_dtype() const { return bf16_wire() ? DType::bf16 : DType::f32; }
  std::int64_t wire_element_bytes() const { return bf16_wire() ? 2 : 4; }
  // bf16 wire: `num_values` f32 values rounded into `wire` (resized), and back.
  static void to_wire(const float* values, std::int64_t num_values, std::vector<bf16_t>& wire);
  static void from_wire(const std::vector<bf16_t>& wire, float* values);
  // Bytes this rank sends to the others under `counts` (per destination) x
  // `element_bytes`, added to the step's statistics under `name`.
  void count_bytes(StepState& step, const std::string& name, const std::vector<std::int64_t>& counts,
                   std::int64_t element_bytes) const;

 private:
  // The pools (DispatchHandle takes and returns).
  std::unique_ptr<StepState> take_step_state(int num_chunks);
  // `reusable`: the step ended with nothing in flight (else it is destroyed).
  void return_step_state(std::unique_ptr<StepState> state, int slot, bool reusable) noexcept;
  PhaseBuffers* take_phase_buffers();
  void return_phase_buffers(PhaseBuffers* buffers) noexcept;
  void recharge() noexcept;

  transport::Communicator* comm_;  // not owned; null for a local dispatcher
  EpConfig config_;
  int num_ranks_, rank_, num_local_experts_, experts_per_rank_;
  TokenCodec codec_;
  std::vector<std::unique_ptr<StepState>> free_steps_;
  std::vector<std::unique_ptr<PhaseBuffers>> buffers_;  // every set made; `in_use` marks the lent ones
  std::vector<bool> slot_in_use_;                       // [kEpGroupMaxStepsInFlight]
  int next_slot_ = 0;
  int steps_in_flight_ = 0;
  std::int64_t pooled_bytes_ = 0;  // capacity of every pooled object as last measured
  LedgerCharge charge_;
};

// Local token range of chunk c: [begin, end).
struct ChunkRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};
ChunkRange chunk_range(std::int64_t num_tokens, int num_chunks, int chunk);

// The dispatcher of `config.dispatch` over `comm` (config validated for
// comm's size first).
std::unique_ptr<Dispatcher> make_dispatcher(transport::Communicator& comm, const EpConfig& config);

}  // namespace epmoe::ep
