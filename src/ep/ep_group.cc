// EpGroup (<epmoe/ep_group.h>): the public face of one rank's dispatcher
// (ep/dispatcher.h), with the construction-time agreement check and the
// dispatch-only calls, which turn the dispatcher's slot protocol (rows and
// slot outputs) into DeepEP's rows-in, rows-out shape.
#include <epmoe/ep_group.h>

#include <cstring>
#include <string>
#include <utility>

#include "comm/all_gather.h"
#include "comm/tag.h"
#include "core/error.h"
#include "ep/dispatcher.h"
#include "ep/local_dispatcher.h"
#include "transport/communicator.h"

namespace epmoe {

namespace {

// The configuration every rank of a group must share, field by field, with
// the key each field is set by. Doubles travel as their bits.
struct AgreedField {
  const char* key;
  std::int64_t (*get)(const EpConfig&);
  std::string (*show)(std::int64_t);
};

std::int64_t bits_of(double value) {
  std::int64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
std::string show_integer(std::int64_t value) { return std::to_string(value); }
std::string show_double(std::int64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return std::to_string(value);
}
std::string show_bool(std::int64_t value) { return value != 0 ? "true" : "false"; }
std::string show_dispatch(std::int64_t value) { return to_string(static_cast<DispatchKind>(value)); }
std::string show_format(std::int64_t value) { return to_string(static_cast<TokenFormat>(value)); }
std::string show_wire(std::int64_t value) { return to_string(static_cast<WireDType>(value)); }
std::string show_balance(std::int64_t value) { return to_string(static_cast<BalanceMode>(value)); }
std::string show_choice(std::int64_t value) { return to_string(static_cast<ReplicaChoice>(value)); }
std::string show_planning(std::int64_t value) { return to_string(static_cast<ReplicaPlanning>(value)); }
std::string show_cotangent(std::int64_t value) {
  return static_cast<CotangentAllGather>(value) == CotangentAllGather::ring ? "ring" : "plain";
}

constexpr AgreedField kAgreedFields[] = {
    {"num_experts", [](const EpConfig& c) -> std::int64_t { return c.num_experts; }, show_integer},
    {"top_k", [](const EpConfig& c) -> std::int64_t { return c.top_k; }, show_integer},
    {"hidden", [](const EpConfig& c) -> std::int64_t { return c.hidden; }, show_integer},
    {"dispatch", [](const EpConfig& c) -> std::int64_t { return static_cast<std::int64_t>(c.dispatch); },
     show_dispatch},
    {"token_chunks", [](const EpConfig& c) -> std::int64_t { return c.num_chunks; }, show_integer},
    {"dedup", [](const EpConfig& c) -> std::int64_t { return c.dedup; }, show_bool},
    {"capacity_factor", [](const EpConfig& c) { return bits_of(c.capacity_factor); }, show_double},
    {"fp8_tokens", [](const EpConfig& c) -> std::int64_t { return static_cast<std::int64_t>(c.token_format); },
     show_format},
    {"wire_dtype", [](const EpConfig& c) -> std::int64_t { return static_cast<std::int64_t>(c.wire_dtype); },
     show_wire},
    {"cotangent_all_gather",
     [](const EpConfig& c) -> std::int64_t { return static_cast<std::int64_t>(c.cotangent_all_gather); },
     show_cotangent},
    {"balance", [](const EpConfig& c) -> std::int64_t { return static_cast<std::int64_t>(c.balance); }, show_balance},
    {"redundant_slots", [](const EpConfig& c) -> std::int64_t { return c.redundant_slots; }, show_integer},
    {"rebalance_threshold", [](const EpConfig& c) { return bits_of(c.rebalance_threshold); }, show_double},
    {"balance_window", [](const EpConfig& c) -> std::int64_t { return c.balance_window; }, show_integer},
    {"balance_period", [](const EpConfig& c) -> std::int64_t { return c.balance_period; }, show_integer},
    {"replica_choice", [](const EpConfig& c) -> std::int64_t { return static_cast<std::int64_t>(c.replica_choice); },
     show_choice},
    {"replica_planning",
     [](const EpConfig& c) -> std::int64_t { return static_cast<std::int64_t>(c.replica_planning); }, show_planning},
    {"replica_costs.compute_flops_per_s",
     [](const EpConfig& c) { return bits_of(c.replica_costs.compute_flops_per_s); }, show_double},
    {"replica_costs.link_bytes_per_s", [](const EpConfig& c) { return bits_of(c.replica_costs.link_bytes_per_s); },
     show_double},
    {"replica_costs.link_latency_s", [](const EpConfig& c) { return bits_of(c.replica_costs.link_latency_s); },
     show_double},
    {"replica_costs.measure", [](const EpConfig& c) -> std::int64_t { return c.replica_costs.measure; }, show_bool},
    {"tag_base", [](const EpConfig& c) -> std::int64_t { return c.tag_base; }, show_integer},
};
constexpr std::size_t kNumAgreedFields = std::size(kAgreedFields);

// The agreement's own tag: outside every group's tag range by construction
// (the top collective tag), so it does not depend on the tag_base it checks.
// Groups are constructed in the same order on every rank, so consecutive
// constructions on one communicator match in order.
constexpr std::uint32_t kAgreementTag = comm::kMaxCollectiveTag;

// Every rank learns every rank's configuration and refuses the first field
// any rank differs in from rank 0, naming both; every rank reaches the same
// verdict, so all throw together and none is left waiting.
void check_agreement(Communicator& comm, const EpConfig& config) {
  std::vector<std::int64_t> mine(kNumAgreedFields);
  for (std::size_t f = 0; f < kNumAgreedFields; ++f) mine[f] = kAgreedFields[f].get(config);
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm.size()));
  comm::ring_all_gather(comm, {.input = mine.data(),
                               .output = all.data(),
                               .num_elements_per_rank = static_cast<std::int64_t>(kNumAgreedFields),
                               .dtype = DType::i64,
                               .tag = kAgreementTag,
                               .timeout = config.timeout})
      .wait();
  for (int r = 1; r < comm.size(); ++r) {
    for (std::size_t f = 0; f < kNumAgreedFields; ++f) {
      const std::int64_t theirs = all[r * kNumAgreedFields + f], first = all[f];
      if (theirs == first) continue;
      const AgreedField& field = kAgreedFields[f];
      throw ConfigError("EP group: rank " + std::to_string(r) + " has " + field.key + "=" + field.show(theirs) +
                        " but rank 0 has " + field.key + "=" + field.show(first) +
                        ": every rank of an EP group must be constructed with the same configuration");
    }
  }
}

// One rank and nothing only a dispatcher implements: no token moves, so the
// group runs the local dispatcher, whichever way it was made (the results of
// a 1-rank communicator and of the single-rank constructor are the same).
bool local_suffices(int num_ranks, const EpConfig& config) {
  return num_ranks == 1 && config.dispatch == DispatchKind::alltoall && !config.dedup && config.capacity_factor == 0 &&
         config.token_format == TokenFormat::f32 && !config.replicas_enabled();
}

}  // namespace

struct EpGroup::Impl {
  Communicator* comm = nullptr;  // null for a single-rank group
  std::unique_ptr<ep::Dispatcher> dispatcher;
};

EpGroup::EpGroup(Communicator& comm, const EpConfig& config, MemoryLedger* ledger) : impl_(std::make_unique<Impl>()) {
  check_agreement(comm, config);
  config.validate(comm.size());
  impl_->comm = &comm;
  impl_->dispatcher = local_suffices(comm.size(), config) ? std::make_unique<ep::LocalDispatcher>(config)
                                                          : ep::make_dispatcher(comm, config);
  impl_->dispatcher->charge_buffers_to(ledger);
}

EpGroup::EpGroup(const EpConfig& config, MemoryLedger* ledger) : impl_(std::make_unique<Impl>()) {
  const auto refuse = [](const std::string& setting) {
    throw ConfigError(setting + ": a single-rank EP group moves no tokens; it needs a communicator");
  };
  if (config.dispatch != DispatchKind::alltoall) refuse("dispatch=" + to_string(config.dispatch));
  if (config.dedup) refuse("dedup=true");
  if (config.capacity_factor != 0) refuse("capacity_factor=" + std::to_string(config.capacity_factor));
  // Checked before fp8_tokens: wire_dtype=bf16 makes the key layer's tokens bf16 too.
  if (config.wire_dtype != WireDType::f32) refuse("wire_dtype=" + to_string(config.wire_dtype));
  if (config.token_format != TokenFormat::f32) refuse("fp8_tokens=" + to_string(config.token_format));
  if (config.replicas_enabled()) refuse("balance=" + to_string(config.balance));
  impl_->dispatcher = std::make_unique<ep::LocalDispatcher>(config);
  impl_->dispatcher->charge_buffers_to(ledger);
}

EpGroup::~EpGroup() = default;
EpGroup::EpGroup(EpGroup&&) noexcept = default;
EpGroup& EpGroup::operator=(EpGroup&&) noexcept = default;

const EpConfig& EpGroup::config() const { return impl_->dispatcher->config(); }
int EpGroup::rank() const { return impl_->dispatcher->rank(); }
int EpGroup::size() const { return impl_->dispatcher->num_ranks(); }
int EpGroup::num_local_experts() const { return impl_->dispatcher->num_local_experts(); }
int EpGroup::first_local_expert() const { return impl_->dispatcher->first_local_expert(); }
int EpGroup::experts_per_rank() const { return impl_->dispatcher->experts_per_rank(); }
std::int64_t EpGroup::buffer_bytes() const { return impl_->dispatcher->buffer_bytes(); }
int EpGroup::steps_in_flight() const { return impl_->dispatcher->steps_in_flight(); }
ep::Dispatcher& EpGroup::dispatcher() { return *impl_->dispatcher; }

Communicator& EpGroup::communicator() {
  if (impl_->comm == nullptr) throw UsageError("EP group: a single-rank group has no communicator");
  return *impl_->comm;
}

// --- dispatch-only steps -----------------------------------------------------

struct DispatchHandle::State {
  enum class Stage { dispatched, combined, combine_backward_done };
  ep::DispatchHandle step;
  Stage stage = Stage::dispatched;
  std::vector<std::int64_t> slot_of_row;  // each row's slot (its token, or its message row)
  std::vector<float> row_weights;         // each row's routing weight
  std::int64_t num_slots = 0;
};

DispatchHandle::DispatchHandle() = default;
DispatchHandle::DispatchHandle(DispatchHandle&&) noexcept = default;
DispatchHandle& DispatchHandle::operator=(DispatchHandle&&) noexcept = default;
DispatchHandle::~DispatchHandle() = default;

const DispatchStats& DispatchHandle::stats() const {
  if (state_ == nullptr) throw UsageError("dispatch handle: stats() of an empty handle (its step has ended)");
  return state_->step.stats();
}

namespace {

void require_view(TensorView view, DType dtype, std::initializer_list<std::int64_t> shape, const char* what) {
  view.require_data(std::string("EP group: ") + what);
  if (view.dtype() != dtype || !view.has_shape(shape)) {
    throw UsageError(std::string("EP group: ") + what + " is " + std::string(dtype_name(view.dtype())) + " " +
                     detail::dims_to_string(view.shape()) + ", expected " + std::string(dtype_name(dtype)) + " " +
                     detail::dims_to_string(std::span<const std::int64_t>(shape.begin(), shape.size())));
  }
  view.require_contiguous(std::string("EP group: ") + what);
}

DispatchHandle::State& expect(std::unique_ptr<DispatchHandle::State>& state, DispatchHandle::State::Stage stage,
                              const char* call) {
  static constexpr const char* kNext[] = {"combine", "combine_backward", "dispatch_backward"};
  if (state == nullptr) {
    throw UsageError(std::string("EP group: ") + call +
                     "() on an empty dispatch handle (moved from, or its step ended with dispatch_backward)");
  }
  if (state->stage != stage) {
    throw UsageError(std::string("EP group: ") + call + "() out of order: the handle's next call is " +
                     kNext[static_cast<int>(state->stage)] +
                     " (the order is dispatch, combine, combine_backward, dispatch_backward)");
  }
  return *state;
}

}  // namespace

Dispatched EpGroup::dispatch(TensorView x, TensorView topk_ids, TensorView topk_weights) {
  const EpConfig& config = impl_->dispatcher->config();
  const std::int64_t num_tokens = x.rank() == 2 ? x.dim(0) : -1, top_k = config.top_k;
  require_view(x, DType::f32, {num_tokens, config.hidden}, "x");
  require_view(topk_ids, DType::i32, {num_tokens, top_k}, "topk_ids");
  require_view(topk_weights, DType::f32, {num_tokens, top_k}, "topk_weights");
  const std::int64_t num_destinations = std::int64_t{size()} * experts_per_rank();
  const std::int32_t* ids = topk_ids.data<std::int32_t>();
  for (std::int64_t i = 0; i < num_tokens * top_k; ++i) {
    if (ids[i] < 0 || ids[i] >= num_destinations) {
      throw UsageError("EP group: topk_ids[" + std::to_string(i / top_k) + ", " + std::to_string(i % top_k) +
                       "] = " + std::to_string(ids[i]) + " is not a physical expert in [0, " +
                       std::to_string(num_destinations) + ")");
    }
  }
  auto state = std::make_unique<DispatchHandle::State>();
  state->step = impl_->dispatcher->start_step(/*num_chunks=*/1);
  state->step.dispatch(x, {ids, topk_weights.data<float>(), num_tokens, static_cast<int>(top_k)});
  ep::ExpertRows rows = state->step.rows(0);
  Dispatched out;
  out.x = std::move(rows.x);
  out.num_rows_per_expert = std::move(rows.group_sizes);
  out.weights = Tensor(DType::f32, {static_cast<std::int64_t>(rows.weights.size())});
  if (!rows.weights.empty()) std::memcpy(out.weights.raw(), rows.weights.data(), rows.weights.size() * sizeof(float));
  state->slot_of_row = std::move(rows.slot_of_row);
  state->row_weights = std::move(rows.weights);
  state->num_slots = rows.num_slots;
  out.handle.state_ = std::move(state);
  return out;
}

Tensor EpGroup::combine(DispatchHandle& handle, TensorView expert_outputs, MutableTensorView y) {
  DispatchHandle::State& state = expect(handle.state_, DispatchHandle::State::Stage::dispatched, "combine");
  const std::int64_t hidden = config().hidden, num_rows = static_cast<std::int64_t>(state.slot_of_row.size());
  const std::int64_t num_tokens = state.step.num_tokens();
  require_view(expert_outputs, DType::f32, {num_rows, hidden}, "expert_outputs");
  Tensor result;
  if (y.raw() == nullptr && y.rank() == 0) {
    result = Tensor(DType::f32, {num_tokens, hidden});
    y = result.mutable_view();
  } else {
    require_view(y, DType::f32, {num_tokens, hidden}, "y");
  }
  // Each slot is the weighted sum of its rows, in ascending row order.
  Tensor slot_outputs = Tensor::zeros(DType::f32, {state.num_slots, hidden});
  const float* rows = expert_outputs.data<float>();
  float* slots = slot_outputs.data<float>();
  for (std::int64_t r = 0; r < num_rows; ++r) {
    const float w = state.row_weights[r];
    float* slot = slots + state.slot_of_row[r] * hidden;
    for (std::int64_t j = 0; j < hidden; ++j) slot[j] += w * rows[r * hidden + j];
  }
  state.step.combine(0, std::move(slot_outputs));
  state.step.finish_forward(y);
  state.stage = DispatchHandle::State::Stage::combined;
  return result;
}

CombineGradients EpGroup::combine_backward(DispatchHandle& handle, TensorView dy, TensorView expert_outputs) {
  DispatchHandle::State& state = expect(handle.state_, DispatchHandle::State::Stage::combined, "combine_backward");
  const std::int64_t hidden = config().hidden, num_rows = static_cast<std::int64_t>(state.slot_of_row.size());
  require_view(dy, DType::f32, {state.step.num_tokens(), hidden}, "dy");
  require_view(expert_outputs, DType::f32, {num_rows, hidden}, "expert_outputs");
  state.step.start_backward(dy);
  const Tensor slot_dy = state.step.cotangents(0);
  CombineGradients grads{Tensor(DType::f32, {num_rows, hidden}), Tensor(DType::f32, {num_rows})};
  const float* rows = expert_outputs.data<float>();
  const float* slots = slot_dy.data<float>();
  float* d_rows = grads.d_expert_outputs.data<float>();
  float* d_weights = grads.d_row_weights.data<float>();
  for (std::int64_t r = 0; r < num_rows; ++r) {
    const float* cotangent = slots + state.slot_of_row[r] * hidden;
    const float w = state.row_weights[r];
    float dot = 0.0f;
    for (std::int64_t j = 0; j < hidden; ++j) {
      d_rows[r * hidden + j] = w * cotangent[j];
      dot += cotangent[j] * rows[r * hidden + j];
    }
    d_weights[r] = dot;
  }
  state.stage = DispatchHandle::State::Stage::combine_backward_done;
  return grads;
}

DispatchGradients EpGroup::dispatch_backward(DispatchHandle& handle, TensorView d_rows, TensorView d_row_weights) {
  DispatchHandle::State& state =
      expect(handle.state_, DispatchHandle::State::Stage::combine_backward_done, "dispatch_backward");
  const std::int64_t hidden = config().hidden, num_rows = static_cast<std::int64_t>(state.slot_of_row.size());
  const std::int64_t num_tokens = state.step.num_tokens();
  require_view(d_rows, DType::f32, {num_rows, hidden}, "d_rows");
  require_view(d_row_weights, DType::f32, {num_rows}, "d_row_weights");
  // A slot's input gradient is the sum of its rows' (ascending row order).
  Tensor slot_dx = Tensor::zeros(DType::f32, {state.num_slots, hidden});
  const float* rows = d_rows.data<float>();
  float* slots = slot_dx.data<float>();
  for (std::int64_t r = 0; r < num_rows; ++r) {
    float* slot = slots + state.slot_of_row[r] * hidden;
    for (std::int64_t j = 0; j < hidden; ++j) slot[j] += rows[r * hidden + j];
  }
  const float* weights = d_row_weights.data<float>();
  state.step.return_gradients(0, std::move(slot_dx), std::vector<float>(weights, weights + num_rows));
  DispatchGradients grads{Tensor(DType::f32, {num_tokens, hidden}),
                          Tensor(DType::f32, {num_tokens, std::int64_t{config().top_k}})};
  state.step.finish_backward(grads.dx.mutable_view(), grads.d_topk_weights.mutable_view());
  handle.state_.reset();
  return grads;
}

}  // namespace epmoe
