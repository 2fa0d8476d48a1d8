#include "ep/dispatch_handle.h"

#include <utility>

#include "core/error.h"
#include "ep/dispatcher.h"
#include "ep/replica_exchange.h"

namespace epmoe::ep {

namespace {

const char* describe(int next) {
  static constexpr const char* kNames[] = {"rows",
                                           "combine",
                                           "finish_forward",
                                           "start_backward",
                                           "cotangents (or redispatch_rows)",
                                           "return_gradients",
                                           "finish_backward"};
  return kNames[next];
}

constexpr const char* kOrder =
    "the order is: per chunk rows then combine, finish_forward, start_backward, per chunk "
    "[redispatch_rows] cotangents then return_gradients, finish_backward";

}  // namespace

DispatchHandle Dispatcher::dispatch(TensorView x, const RoutingView& routing) {
  if (step_in_flight_) {
    throw UsageError(
        "dispatch() while this dispatcher's previous step is in flight: finish its backward (or "
        "destroy its handle) first");
  }
  EPMOE_CHECK(x.dtype() == DType::f32 && x.is_contiguous());  // the layer refuses a strided x with its name
  DispatchHandle handle(*this, num_chunks());
  step_in_flight_ = true;
  start_forward(x, routing);
  return handle;
}

void Dispatcher::charge_buffers_to(MemoryLedger* ledger) {
  dispatch_buffers_ = LedgerCharge(ledger, "buffer/dispatch", 0);
  replica_buffers_ = LedgerCharge(ledger, "buffer/replica slots", 0);
  update_buffer_charges();
}

// Called where no exchange of the step is in flight (after finish_forward
// and finish_backward): an exchange may resize the buffers it receives into,
// so their capacity is not read while one runs.
void Dispatcher::update_buffer_charges() {
  dispatch_buffers_.resize(persistent_buffer_bytes());
  ReplicaExchange* exchange = replicas();
  replica_buffers_.resize(exchange != nullptr ? exchange->buffer_bytes() : 0);
}

DispatchHandle::DispatchHandle(Dispatcher& dispatcher, int num_chunks)
    : dispatcher_(&dispatcher), num_chunks_(num_chunks) {}

DispatchHandle::DispatchHandle(DispatchHandle&& other) noexcept
    : dispatcher_(std::exchange(other.dispatcher_, nullptr)),
      num_chunks_(other.num_chunks_),
      next_(other.next_),
      chunk_(other.chunk_),
      redispatched_(other.redispatched_) {}

DispatchHandle& DispatchHandle::operator=(DispatchHandle&& other) noexcept {
  if (this != &other) {
    release();
    dispatcher_ = std::exchange(other.dispatcher_, nullptr);
    num_chunks_ = other.num_chunks_;
    next_ = other.next_;
    chunk_ = other.chunk_;
    redispatched_ = other.redispatched_;
  }
  return *this;
}

DispatchHandle::~DispatchHandle() { release(); }

void DispatchHandle::release() noexcept {
  if (dispatcher_ != nullptr) dispatcher_->step_in_flight_ = false;
  dispatcher_ = nullptr;
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
                     std::to_string(num_chunks_) + " chunks)");
  }
}

ExpertRows DispatchHandle::rows(int chunk) {
  expect(Next::rows, chunk, "rows");
  ExpertRows rows = dispatcher_->receive_rows(chunk);
  next_ = Next::combine;
  return rows;
}

void DispatchHandle::combine(int chunk, Tensor slot_outputs) {
  expect(Next::combine, chunk, "combine");
  dispatcher_->send_outputs(chunk, std::move(slot_outputs));
  ++chunk_;
  next_ = chunk_ < num_chunks_ ? Next::rows : Next::finish_forward;
}

Tensor DispatchHandle::finish_forward() {
  expect(Next::finish_forward, -1, "finish_forward");
  Tensor y = dispatcher_->finish_forward();
  dispatcher_->update_buffer_charges();
  next_ = Next::start_backward;
  return y;
}

void DispatchHandle::start_backward(TensorView dy) {
  expect(Next::start_backward, -1, "start_backward");
  EPMOE_CHECK(dy.dtype() == DType::f32 && dy.is_contiguous());
  dispatcher_->start_backward(dy);
  chunk_ = 0;
  redispatched_ = false;
  next_ = Next::cotangents;
}

ExpertRows DispatchHandle::redispatch_rows(int chunk) {
  expect(Next::cotangents, chunk, "redispatch_rows");
  if (redispatched_) {
    throw UsageError("dispatch handle: redispatch_rows(chunk " + std::to_string(chunk) +
                     ") called twice for the chunk");
  }
  ExpertRows rows = dispatcher_->redispatch_rows(chunk);
  redispatched_ = true;
  return rows;
}

Tensor DispatchHandle::cotangents(int chunk) {
  expect(Next::cotangents, chunk, "cotangents");
  Tensor slots = dispatcher_->receive_cotangents(chunk);
  next_ = Next::return_gradients;
  return slots;
}

void DispatchHandle::return_gradients(int chunk, Tensor slot_dx, std::vector<float> row_dweights) {
  expect(Next::return_gradients, chunk, "return_gradients");
  dispatcher_->send_gradients(chunk, std::move(slot_dx), std::move(row_dweights));
  ++chunk_;
  redispatched_ = false;
  next_ = chunk_ < num_chunks_ ? Next::cotangents : Next::finish_backward;
}

DispatchGradients DispatchHandle::finish_backward() {
  expect(Next::finish_backward, -1, "finish_backward");
  DispatchGradients grads = dispatcher_->finish_backward();
  dispatcher_->update_buffer_charges();
  release();
  return grads;
}

}  // namespace epmoe::ep
