#include "ep/dispatch_handle.h"

#include <utility>

#include "core/error.h"
#include "ep/dispatcher.h"

namespace epmoe::ep {

namespace {

const char* describe(int next) {
  static constexpr const char* kNames[] = {"dispatch",
                                           "rows",
                                           "combine",
                                           "finish_forward",
                                           "start_backward",
                                           "cotangents (or redispatch_rows)",
                                           "return_gradients",
                                           "finish_backward",
                                           "nothing (the step ended)"};
  return kNames[next];
}

constexpr const char* kOrder =
    "the order is: dispatch, per chunk rows then combine, finish_forward, start_backward, per chunk "
    "[redispatch_rows] cotangents then return_gradients, finish_backward";

// The caller's output of the step: f32, C-contiguous, [rows, width].
float* output_rows(MutableTensorView out, std::int64_t rows, std::int64_t width, const char* what) {
  EPMOE_CHECK(out.dtype() == DType::f32 && out.is_contiguous() && out.has_shape({rows, width}), what,
              " must be an f32 C-contiguous [", rows, ", ", width, "] view, not ", detail::dims_to_string(out.shape()));
  return static_cast<float*>(out.raw());
}

}  // namespace

DispatchHandle::DispatchHandle(Dispatcher& dispatcher, std::unique_ptr<StepState> state, int slot)
    : dispatcher_(&dispatcher), state_(std::move(state)), slot_(slot) {}

DispatchHandle::DispatchHandle(DispatchHandle&& other) noexcept { *this = std::move(other); }

DispatchHandle& DispatchHandle::operator=(DispatchHandle&& other) noexcept {
  if (this != &other) {
    release();
    dispatcher_ = std::exchange(other.dispatcher_, nullptr);
    state_ = std::move(other.state_);
    slot_ = std::exchange(other.slot_, -1);
    next_ = other.next_;
    chunk_ = other.chunk_;
    redispatched_ = other.redispatched_;
    chunks_sent_ = other.chunks_sent_;
    cotangents_started_ = other.cotangents_started_;
  }
  return *this;
}

DispatchHandle::~DispatchHandle() { release(); }

void DispatchHandle::lend_buffers() {
  EPMOE_CHECK(state_->buffers == nullptr);
  state_->buffers = dispatcher_->take_phase_buffers();
}

void DispatchHandle::return_buffers() noexcept {
  if (state_ != nullptr && state_->buffers != nullptr) {
    dispatcher_->return_phase_buffers(std::exchange(state_->buffers, nullptr));
  }
}

// A step that ended (its forward finished with no backward to follow, or
// its backward finished) has nothing in flight: its layout and buffers go
// back to the pools as they are. A step abandoned mid-phase (an error
// unwinding, a caller dropping it) may have collectives in flight that
// still write into its buffers: the layout is destroyed first (its
// collectives' handles wait for them, or cancel them while an exception
// unwinds), and only then are the buffers safe to lend again.
void DispatchHandle::release() noexcept {
  if (dispatcher_ == nullptr) return;
  const bool ended = next_ == Next::dispatch || next_ == Next::start_backward || next_ == Next::done;
  PhaseBuffers* buffers = std::exchange(state_->buffers, nullptr);
  dispatcher_->return_step_state(std::move(state_), slot_, ended);
  if (buffers != nullptr) dispatcher_->return_phase_buffers(buffers);
  dispatcher_ = nullptr;
  slot_ = -1;
}

int DispatchHandle::num_chunks() const {
  EPMOE_CHECK(state_ != nullptr, "a dispatch handle outside its step");
  return state_->num_chunks;
}

std::int64_t DispatchHandle::num_tokens() const {
  EPMOE_CHECK(state_ != nullptr, "a dispatch handle outside its step");
  return state_->num_tokens;
}

std::uint32_t DispatchHandle::tag_base() const {
  EPMOE_CHECK(state_ != nullptr, "a dispatch handle outside its step");
  return state_->tag_base;
}

const DispatchStats& DispatchHandle::stats() const {
  EPMOE_CHECK(state_ != nullptr, "a dispatch handle outside its step");
  return state_->stats;
}

void DispatchHandle::expect(Next next, int chunk, const char* call) const {
  const std::string with_chunk =
      chunk >= 0 ? std::string(call) + "(chunk " + std::to_string(chunk) + ")" : std::string(call) + "()";
  if (dispatcher_ == nullptr) {
    throw UsageError("dispatch handle: " + with_chunk +
                     " on a handle not in a step (empty, moved from, or its "
                     "finish_backward returned)");
  }
  if (next != next_ || (chunk >= 0 && chunk != chunk_)) {
    const bool per_chunk =
        next_ == Next::rows || next_ == Next::combine || next_ == Next::cotangents || next_ == Next::return_gradients;
    throw UsageError("dispatch handle: " + with_chunk + " out of order: the next call must be " +
                     describe(static_cast<int>(next_)) +
                     (per_chunk ? "(chunk " + std::to_string(chunk_) + ")" : std::string("()")) + " (" + kOrder + ", " +
                     std::to_string(state_->num_chunks) + " chunks)");
  }
}

void DispatchHandle::dispatch(TensorView x, const RoutingView& routing) {
  expect(Next::dispatch, -1, "dispatch");
  EPMOE_CHECK(x.dtype() == DType::f32 && x.is_contiguous());  // the layer refuses a strided x with its name
  EPMOE_CHECK(x.rank() == 2 && x.dim(0) == routing.num_tokens && x.dim(1) == dispatcher_->config().hidden);
  EPMOE_CHECK_EQ(routing.top_k, dispatcher_->config().top_k);
  next_ = Next::rows;  // from here on the step is under way (abandoned if this throws)
  StepState& step = *state_;
  step.x = x;
  step.dy = {};
  step.num_tokens = routing.num_tokens;
  step.top_k = routing.top_k;
  reset_stats(step.stats, dispatcher_->num_local_experts());
  lend_buffers();
  if (dispatcher_->config().token_format == TokenFormat::fp8_tensor) dispatcher_->start_tensor_scales(step);
  dispatcher_->begin_step(step, routing);
  dispatcher_->start_dispatch(step, 0, /*remat=*/false);
  chunks_sent_ = 1;
  chunk_ = 0;
}

ExpertRows DispatchHandle::rows(int chunk) {
  expect(Next::rows, chunk, "rows");
  StepState& step = *state_;
  ExpertRows rows = dispatcher_->collect_rows(step, chunk, /*remat=*/false);
  // The pipeline: the next chunk's exchange runs while the experts compute this one.
  if (chunk + 1 < step.num_chunks && chunks_sent_ == chunk + 1) {
    dispatcher_->start_dispatch(step, chunk + 1, /*remat=*/false);
    chunks_sent_ += 1;
  }
  count_rows(step.stats, rows, dispatcher_->num_local_experts());
  next_ = Next::combine;
  return rows;
}

void DispatchHandle::combine(int chunk, Tensor slot_outputs) {
  expect(Next::combine, chunk, "combine");
  dispatcher_->start_combine(*state_, chunk, std::move(slot_outputs));
  ++chunk_;
  next_ = chunk_ < state_->num_chunks ? Next::rows : Next::finish_forward;
}

void DispatchHandle::finish_forward(MutableTensorView y) {
  expect(Next::finish_forward, -1, "finish_forward");
  StepState& step = *state_;
  float* out = output_rows(y, step.num_tokens, dispatcher_->config().hidden, "y");
  for (int c = 0; c < step.num_chunks; ++c) dispatcher_->finish_combine(step, c, out);
  return_buffers();
  next_ = Next::start_backward;
}

void DispatchHandle::start_backward(TensorView dy) {
  expect(Next::start_backward, -1, "start_backward");
  EPMOE_CHECK(dy.dtype() == DType::f32 && dy.is_contiguous());
  EPMOE_CHECK(dy.has_shape(state_->x.shape()));
  next_ = Next::cotangents;  // from here on the backward is under way
  StepState& step = *state_;
  step.dy = dy;
  lend_buffers();
  cotangents_started_ = 0;
  if (dispatcher_->config().cotangent_all_gather == CotangentAllGather::ring) {
    dispatcher_->start_cotangents(step, 0);
    cotangents_started_ = 1;
  }
  chunk_ = 0;
  redispatched_ = false;
}

ExpertRows DispatchHandle::redispatch_rows(int chunk) {
  expect(Next::cotangents, chunk, "redispatch_rows");
  if (redispatched_) {
    throw UsageError("dispatch handle: redispatch_rows(chunk " + std::to_string(chunk) +
                     ") called twice for the chunk");
  }
  dispatcher_->start_dispatch(*state_, chunk, /*remat=*/true);
  ExpertRows rows = dispatcher_->collect_rows(*state_, chunk, /*remat=*/true);
  redispatched_ = true;
  return rows;
}

Tensor DispatchHandle::cotangents(int chunk) {
  expect(Next::cotangents, chunk, "cotangents");
  StepState& step = *state_;
  if (cotangents_started_ == chunk) {
    dispatcher_->start_cotangents(step, chunk);
    cotangents_started_ += 1;
  }
  Tensor slots = dispatcher_->collect_cotangents(step, chunk);
  // The pipeline: the next chunk's cotangents travel while this one's backward runs.
  if (dispatcher_->config().cotangent_all_gather == CotangentAllGather::ring && chunk + 1 < step.num_chunks &&
      cotangents_started_ == chunk + 1) {
    dispatcher_->start_cotangents(step, chunk + 1);
    cotangents_started_ += 1;
  }
  next_ = Next::return_gradients;
  return slots;
}

void DispatchHandle::return_gradients(int chunk, Tensor slot_dx, std::vector<float> row_dweights) {
  expect(Next::return_gradients, chunk, "return_gradients");
  dispatcher_->start_gradients(*state_, chunk, std::move(slot_dx), std::move(row_dweights));
  ++chunk_;
  redispatched_ = false;
  next_ = chunk_ < state_->num_chunks ? Next::cotangents : Next::finish_backward;
}

DispatchStats DispatchHandle::finish_backward(MutableTensorView dx, MutableTensorView d_topk_weights) {
  expect(Next::finish_backward, -1, "finish_backward");
  StepState& step = *state_;
  float* dx_rows = output_rows(dx, step.num_tokens, dispatcher_->config().hidden, "dx");
  float* dweight_rows = output_rows(d_topk_weights, step.num_tokens, step.top_k, "d_topk_weights");
  for (int c = 0; c < step.num_chunks; ++c) dispatcher_->finish_gradients(step, c, dx_rows, dweight_rows);
  DispatchStats stats = std::move(step.stats);
  next_ = Next::done;
  release();
  return stats;
}

}  // namespace epmoe::ep
