#include "ep_group_binding.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include <epmoe/error.h>
#include <epmoe/keys.h>

#include "array_views.h"
#include "communicator_binding.h"

namespace nb = nanobind;

namespace epmoe::python {

PyEpGroup::PyEpGroup(nb::object communicator, const EpConfig& config) : communicator_(std::move(communicator)) {
  if (communicator_.is_none()) {
    group_ = std::make_unique<EpGroup>(config);
    return;
  }
  PyCommunicator& py_comm = nb::cast<PyCommunicator&>(communicator_);
  Communicator& comm = py_comm.get("EpGroup");
  {
    nb::gil_scoped_release release;  // collective: the other ranks may be Python threads of this process
    group_ = std::make_unique<EpGroup>(comm, config);
  }
  on_mpi_ = py_comm.is_mpi();
  track(on_mpi_);
}

EpGroup& PyEpGroup::get(const char* call) {
  if (group_ == nullptr) {
    throw UsageError(std::string("EpGroup.") + call +
                     "(): the group was closed at interpreter exit (MPI is finalised next)");
  }
  return *group_;
}

void PyEpGroup::close() noexcept { group_.reset(); }

namespace {

// One dispatch-only step: the handle, its group and the dispatched x, which
// must stay alive and unchanged until dispatch_backward ends the step.
class PyDispatchHandle final : public MpiLifetime {
 public:
  PyDispatchHandle(nb::object group, bool on_mpi) : group_(std::move(group)) { track(on_mpi); }
  ~PyDispatchHandle() override = default;

  DispatchHandle& handle() { return handle_; }
  ArrayRef& x() { return x_; }
  const nb::object& group() const { return group_; }
  std::int64_t num_tokens = 0;  // x's rows: combine's output rows
  void end_step() {
    handle_ = DispatchHandle();
    x_ = ArrayRef();
  }
  void close() noexcept override { handle_ = DispatchHandle(); }

 private:
  nb::object group_;  // first, so that it is released after the handle (members end in reverse order)
  ArrayRef x_;
  DispatchHandle handle_;
};

// The handle's own group, or a UsageError naming the call.
PyDispatchHandle& handle_of(nb::pointer_and_handle<PyEpGroup> self, PyDispatchHandle& handle, const char* call) {
  if (!handle.group().is(self.h)) {
    throw UsageError(std::string("EpGroup.") + call + "(): the dispatch handle belongs to another EP group");
  }
  return handle;
}

nb::object counts_array(const std::vector<std::int64_t>& counts) {
  Tensor out(DType::i64, {static_cast<std::int64_t>(counts.size())});
  std::copy(counts.begin(), counts.end(), out.data<std::int64_t>());
  return to_numpy(std::move(out));
}

nb::tuple dispatch(nb::pointer_and_handle<PyEpGroup> self, nb::handle x, nb::handle topk_ids, nb::handle topk_weights) {
  constexpr const char* kCall = "EpGroup.dispatch";
  EpGroup& group = self.p->get("dispatch");
  auto handle = std::make_unique<PyDispatchHandle>(nb::borrow(self.h), self.p->on_mpi());
  ArrayRef ids_ref, weights_ref;
  const TensorView x_view = input_view(x, DType::f32, kCall, "x", handle->x());
  const TensorView ids_view = input_view(topk_ids, DType::i32, kCall, "topk_ids", ids_ref);
  const TensorView weights_view = input_view(topk_weights, DType::f32, kCall, "topk_weights", weights_ref);
  handle->num_tokens = x_view.dim(0);
  Dispatched dispatched;
  {
    nb::gil_scoped_release release;
    dispatched = group.dispatch(x_view, ids_view, weights_view);
  }
  handle->handle() = std::move(dispatched.handle);
  return nb::make_tuple(to_numpy(std::move(dispatched.x)), counts_array(dispatched.num_rows_per_expert),
                        to_numpy(std::move(dispatched.weights)), nb::cast(std::move(handle)));
}

nb::object combine(nb::pointer_and_handle<PyEpGroup> self, PyDispatchHandle& handle, nb::handle expert_outputs,
                   nb::handle y) {
  constexpr const char* kCall = "EpGroup.combine";
  EpGroup& group = self.p->get("combine");
  handle_of(self, handle, "combine");
  ArrayRef outputs_ref;
  MutableArrayRef y_ref;
  const TensorView outputs_view = input_view(expert_outputs, DType::f32, kCall, "expert_outputs", outputs_ref);
  const MutableTensorView y_view = output_view(y, DType::f32, kCall, "y", y_ref);
  Tensor allocated;
  {
    nb::gil_scoped_release release;
    allocated = group.combine(handle.handle(), outputs_view, y_view);
  }
  return y.is_none() ? to_numpy(std::move(allocated)) : nb::borrow(y);
}

nb::tuple combine_backward(nb::pointer_and_handle<PyEpGroup> self, PyDispatchHandle& handle, nb::handle dy,
                           nb::handle expert_outputs) {
  constexpr const char* kCall = "EpGroup.combine_backward";
  EpGroup& group = self.p->get("combine_backward");
  handle_of(self, handle, "combine_backward");
  ArrayRef dy_ref, outputs_ref;
  const TensorView dy_view = input_view(dy, DType::f32, kCall, "dy", dy_ref);
  const TensorView outputs_view = input_view(expert_outputs, DType::f32, kCall, "expert_outputs", outputs_ref);
  CombineGradients grads;
  {
    nb::gil_scoped_release release;
    grads = group.combine_backward(handle.handle(), dy_view, outputs_view);
  }
  return nb::make_tuple(to_numpy(std::move(grads.d_expert_outputs)), to_numpy(std::move(grads.d_row_weights)));
}

nb::tuple dispatch_backward(nb::pointer_and_handle<PyEpGroup> self, PyDispatchHandle& handle, nb::handle d_rows,
                            nb::handle d_row_weights) {
  constexpr const char* kCall = "EpGroup.dispatch_backward";
  EpGroup& group = self.p->get("dispatch_backward");
  handle_of(self, handle, "dispatch_backward");
  ArrayRef rows_ref, weights_ref;
  const TensorView rows_view = input_view(d_rows, DType::f32, kCall, "d_rows", rows_ref);
  const TensorView weights_view = input_view(d_row_weights, DType::f32, kCall, "d_row_weights", weights_ref);
  DispatchGradients grads;
  {
    nb::gil_scoped_release release;
    grads = group.dispatch_backward(handle.handle(), rows_view, weights_view);
  }
  handle.end_step();
  return nb::make_tuple(to_numpy(std::move(grads.dx)), to_numpy(std::move(grads.d_topk_weights)));
}

nb::dict stats_dict(const DispatchStats& stats) {
  nb::dict out;
  out["bytes_sent"] = stats.bytes_sent;
  out["rows_per_local_expert"] = stats.rows_per_local_expert;
  out["dropped_pairs"] = stats.dropped_pairs;
  return out;
}

}  // namespace

void bind_ep_group(nb::module_& m) {
  nb::class_<PyDispatchHandle>(m, "DispatchHandle")
      .def_prop_ro("num_tokens", [](PyDispatchHandle& h) { return h.num_tokens; })
      .def("stats", [](PyDispatchHandle& h) { return stats_dict(h.handle().stats()); })
      .def("_close", &PyDispatchHandle::close);

  nb::class_<PyEpGroup>(m, "EpGroup")
      .def(
          "__init__",
          [](PyEpGroup* self, nb::object communicator, int num_experts, int top_k, std::int64_t hidden,
             const std::map<std::string, std::string>& keys) {
            const EpConfig config = ep_config_from_keys(keys, num_experts, top_k, hidden);
            new (self) PyEpGroup(std::move(communicator), config);
          },
          nb::arg("communicator").none(), nb::arg("num_experts"), nb::arg("top_k"), nb::arg("hidden"), nb::arg("keys"))
      .def_prop_ro("rank", [](PyEpGroup& g) { return g.get("rank").rank(); })
      .def_prop_ro("size", [](PyEpGroup& g) { return g.get("size").size(); })
      .def_prop_ro("num_experts", [](PyEpGroup& g) { return g.get("num_experts").config().num_experts; })
      .def_prop_ro("top_k", [](PyEpGroup& g) { return g.get("top_k").config().top_k; })
      .def_prop_ro("hidden", [](PyEpGroup& g) { return g.get("hidden").config().hidden; })
      .def_prop_ro("dispatch_kind", [](PyEpGroup& g) { return to_string(g.get("dispatch_kind").config().dispatch); })
      .def_prop_ro("num_local_experts", [](PyEpGroup& g) { return g.get("num_local_experts").num_local_experts(); })
      .def_prop_ro("first_local_expert", [](PyEpGroup& g) { return g.get("first_local_expert").first_local_expert(); })
      .def_prop_ro("experts_per_rank", [](PyEpGroup& g) { return g.get("experts_per_rank").experts_per_rank(); })
      .def_prop_ro("buffer_bytes", [](PyEpGroup& g) { return g.get("buffer_bytes").buffer_bytes(); })
      .def_prop_ro("steps_in_flight", [](PyEpGroup& g) { return g.get("steps_in_flight").steps_in_flight(); })
      .def("dispatch", &dispatch, nb::arg("x"), nb::arg("topk_ids"), nb::arg("topk_weights"))
      .def("combine", &combine, nb::arg("handle"), nb::arg("expert_outputs"), nb::arg("y").none() = nb::none())
      .def("combine_backward", &combine_backward, nb::arg("handle"), nb::arg("dy"), nb::arg("expert_outputs"))
      .def("dispatch_backward", &dispatch_backward, nb::arg("handle"), nb::arg("d_rows"), nb::arg("d_row_weights"))
      .def("_close", &PyEpGroup::close);
}

}  // namespace epmoe::python
