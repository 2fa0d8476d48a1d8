// _epmoe.EpGroup and _epmoe.DispatchHandle (<epmoe/ep_group.h>): one rank's
// member of an expert-parallel group on a Communicator, configured with the
// key vocabulary of `epmoe layer` (ep_config_from_keys), and the
// dispatch-only calls. python/epmoe/ep_group.py is the public face.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>

#include <epmoe/ep_group.h>

#include "mpi_lifetime.h"

namespace epmoe::python {

class PyEpGroup final : public MpiLifetime {
 public:
  // `communicator`: a PyCommunicator (kept alive), or None for a single-rank
  // group without one. Collective over the communicator; the GIL is released
  // while the ranks compare their configurations.
  PyEpGroup(nanobind::object communicator, const EpConfig& config);
  ~PyEpGroup() override = default;

  // The group; UsageError naming `call` once closed.
  EpGroup& get(const char* call);
  bool on_mpi() const { return on_mpi_; }
  void close() noexcept override;

 private:
  // First, so that it is released after the group (members end in reverse
  // order); None for a single-rank group.
  nanobind::object communicator_;
  std::unique_ptr<EpGroup> group_;
  bool on_mpi_ = false;
};

void bind_ep_group(nanobind::module_& m);

}  // namespace epmoe::python
