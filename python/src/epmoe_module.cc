// epmoe._epmoe: the native half of the `epmoe` Python package. Thin: every
// function converts its arguments, releases the GIL while the C++ computes
// or communicates, and hands back numpy arrays or JSON text;
// python/epmoe/*.py turn them into what the user passed (numpy or torch)
// and dicts, and check argument types. epmoe's exceptions become Python's
// as error_translation.h lists.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "balance/expert_load_history.h"
#include "balance/rebalance_experts.h"
#include "balance/replica_planner.h"
#include "communicator_binding.h"
#include "core/error.h"
#include "ep_group_binding.h"
#include "error_translation.h"
#include "kernels/gemm.h"
#include "layer_binding.h"
#include "moe_layer_binding.h"
#include "run/balance_replay.h"
#include "run/json_output.h"
#include "run/plan_run.h"

namespace nb = nanobind;

namespace {

using Int64Array = nb::ndarray<nb::numpy, std::int64_t>;

// A numpy array that owns `values` (moved into a capsule).
Int64Array to_numpy(std::vector<std::int64_t>&& values, std::initializer_list<std::size_t> shape) {
  auto* owned = new std::vector<std::int64_t>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<std::int64_t>*>(p); });
  return Int64Array(owned->data(), shape, owner);
}

std::vector<epmoe::run::KeyAssignment> to_assignments(const std::vector<std::pair<std::string, std::string>>& keys,
                                                      const std::string& origin) {
  std::vector<epmoe::run::KeyAssignment> out;
  for (const auto& [key, value] : keys) out.push_back({key, value, origin});
  return out;
}

// epmoe.EplbAssertionError, made once at import: what rebalance_experts
// raises where DeepSeek's EPLB asserts (balance::EplbAssertionError), so that
// EPLB's callers' `except AssertionError` catch it; a ValueError too, as
// every other bad argument of epmoe.
PyObject* eplb_assertion_error = nullptr;

void bind_eplb_assertion_error(nb::module_& m) {
  PyObject* bases = PyTuple_Pack(2, PyExc_AssertionError, PyExc_ValueError);
  if (bases == nullptr) throw nb::python_error();
  eplb_assertion_error = PyErr_NewExceptionWithDoc(
      "epmoe.EplbAssertionError",
      "An argument of rebalance_experts that breaks a condition DeepSeek's EPLB asserts on (a divisibility, fewer "
      "replicas than experts): an AssertionError as EPLB raises there, and a ValueError.",
      bases, nullptr);
  Py_DECREF(bases);
  if (eplb_assertion_error == nullptr) throw nb::python_error();
  m.attr("EplbAssertionError") = nb::borrow(eplb_assertion_error);
}

std::tuple<Int64Array, Int64Array, Int64Array> rebalance_experts(
    nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu> weight, int num_replicas, int num_groups,
    int num_nodes, int num_gpus) {
  const int num_layers = static_cast<int>(weight.shape(0)), num_experts = static_cast<int>(weight.shape(1));
  epmoe::balance::ExpertRebalance result;
  try {
    nb::gil_scoped_release release;  // `weight` stays referenced by the caller's frame
    result = epmoe::balance::rebalance_experts({weight.data(), weight.size()}, num_layers, num_experts,
                                               {num_replicas, num_groups, num_nodes, num_gpus});
  } catch (const epmoe::balance::EplbAssertionError& e) {  // the GIL is held again here
    PyErr_SetString(eplb_assertion_error, e.what());
    throw nb::python_error();
  }
  const std::size_t L = num_layers, E = num_experts, P = num_replicas;
  return {to_numpy(std::move(result.physical_to_logical), {L, P}),
          to_numpy(std::move(result.logical_to_physical), {L, E, static_cast<std::size_t>(result.max_copies)}),
          to_numpy(std::move(result.logical_count), {L, E})};
}

std::vector<std::tuple<int, int, std::int64_t>> plan_replicas(
    nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> counts, int ranks, int slots,
    double rebalance_threshold) {
  const int num_experts = static_cast<int>(counts.shape(0));
  using epmoe::ConfigError;
  if (ranks < 1) throw ConfigError("ranks=" + std::to_string(ranks) + ": must be >= 1");
  if (slots < 0) throw ConfigError("slots=" + std::to_string(slots) + ": must be >= 0");
  if (!(rebalance_threshold >= 1.0))
    throw ConfigError("rebalance_threshold=" + std::to_string(rebalance_threshold) + ": must be >= 1");
  if (num_experts == 0 || num_experts % ranks != 0)
    throw ConfigError("counts: " + std::to_string(num_experts) +
                      " experts; must be a positive multiple of ranks=" + std::to_string(ranks));
  const std::span<const std::int64_t> expert_counts(counts.data(), counts.size());
  std::int64_t total = 0;
  for (std::size_t e = 0; e < expert_counts.size(); ++e) {
    if (expert_counts[e] < 0 || __builtin_add_overflow(total, expert_counts[e], &total))
      throw ConfigError("counts[" + std::to_string(e) + "] = " + std::to_string(expert_counts[e]) +
                        ": counts must be >= 0 and sum within int64");
  }
  epmoe::balance::ReplicaPlan plan;
  {
    nb::gil_scoped_release release;
    plan = epmoe::balance::plan_replicas(expert_counts, epmoe::balance::contiguous_home_ranks(num_experts, ranks),
                                         {ranks, slots, rebalance_threshold});
  }
  std::vector<std::tuple<int, int, std::int64_t>> copies;
  for (int e = 0; e < num_experts; ++e) {
    for (const epmoe::balance::ExpertCopy& copy : plan.copies_of(e))
      copies.emplace_back(e, copy.rank, copy.token_quota);
  }
  return copies;
}

std::string plan_json(const std::vector<std::pair<std::string, std::string>>& keys) {
  const std::vector<epmoe::run::KeyAssignment> assignments = to_assignments(keys, "epmoe.plan()");
  nb::gil_scoped_release release;
  return epmoe::run::plan_run_to_json(epmoe::run::run_plan(assignments)).dump();
}

std::string replay_balance_json(nb::ndarray<const std::int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> loads,
                                const std::vector<std::pair<std::string, std::string>>& keys) {
  using epmoe::ConfigError;
  const epmoe::run::ConfigValues values =
      epmoe::run::replay_key_registry().parse(to_assignments(keys, "epmoe.replay_balance()"));
  if (values.get_string("layer") != "all")
    throw ConfigError("layer=" + values.get_string("layer") + ": replay_balance takes one layer's loads [steps, E]");
  const epmoe::run::ReplaySettings settings = epmoe::run::replay_settings(values, /*json=*/true);
  epmoe::balance::ExpertLoadHistory history;
  history.num_steps = static_cast<int>(loads.shape(0));
  history.num_experts = static_cast<int>(loads.shape(1));
  if (history.num_steps == 0 || history.num_experts == 0)
    throw ConfigError("loads: shape [" + std::to_string(history.num_steps) + ", " +
                      std::to_string(history.num_experts) + "] has no steps or no experts");
  history.counts.assign(loads.data(), loads.data() + loads.size());
  std::int64_t total = 0;
  for (std::size_t i = 0; i < history.counts.size(); ++i) {
    if (history.counts[i] < 0 || __builtin_add_overflow(total, history.counts[i], &total))
      throw ConfigError("loads[" + std::to_string(i / history.num_experts) + ", " +
                        std::to_string(i % history.num_experts) + "] = " + std::to_string(history.counts[i]) +
                        ": loads are token counts >= 0 (at most 2^63-1 in all)");
  }
  epmoe::balance::validate(settings.options, history.num_experts);
  nlohmann::json policies;
  {
    nb::gil_scoped_release release;
    policies = epmoe::run::replay_policies_json(history, settings, nullptr);
  }
  const nlohmann::json report = {{"num_steps", history.num_steps},
                                 {"num_experts", history.num_experts},
                                 {"expert_weight_bytes", settings.expert_weight_bytes},
                                 {"config", epmoe::run::config_to_json(values)},
                                 {"policies", std::move(policies)}};
  return report.dump();
}

// The process's GEMM census (kernels/gemm.h), then zeroed when asked.
nb::list gemm_implementations(bool reset) {
  nb::list out;
  for (const epmoe::GemmImplementationUse& use : epmoe::gemm_implementation_census()) {
    nb::dict entry;
    entry["implementation"] = use.implementation;
    entry["compute_dtype"] = epmoe::to_string(use.compute_dtype);
    entry["calls"] = use.calls;
    entry["gflop"] = static_cast<double>(use.flops) * 1e-9;
    out.append(entry);
  }
  if (reset) epmoe::reset_gemm_implementation_census();
  return out;
}

}  // namespace

NB_MODULE(_epmoe, m) {
  m.doc() = "epmoe's native module; use the functions of the epmoe package";
  using namespace epmoe::python;
  bind_errors(m);
  bind_eplb_assertion_error(m);
  m.def("rebalance_experts", &rebalance_experts, nb::arg("weight"), nb::arg("num_replicas"), nb::arg("num_groups"),
        nb::arg("num_nodes"), nb::arg("num_gpus"));
  m.def("plan_replicas", &plan_replicas, nb::arg("counts"), nb::arg("ranks"), nb::arg("slots"),
        nb::arg("rebalance_threshold"));
  m.def("plan_json", &plan_json, nb::arg("keys"));
  m.def("replay_balance_json", &replay_balance_json, nb::arg("loads"), nb::arg("keys"));
  m.def("gemm_implementations", &gemm_implementations, nb::arg("reset"));
  bind_layer(m);
  bind_communicators(m);
  bind_ep_group(m);
  bind_moe_layer(m);
}
