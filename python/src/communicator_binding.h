// _epmoe.Communicator, _epmoe.ThreadsWorld and the communicator over an MPI
// communicator (<epmoe/communicator.h>, <epmoe/threads_world.h>,
// <epmoe/mpi_communicator.h>). python/epmoe/communicators.py is the public
// face: ThreadsWorld, run_threads and mpi_communicator(mpi4py_comm).
#pragma once

#include <nanobind/nanobind.h>

#include <memory>

#include <epmoe/communicator.h>

#include "mpi_lifetime.h"

namespace epmoe::python {

// One rank's communicator: owned (MPI), or a rank of a ThreadsWorld that
// this object keeps alive.
class PyCommunicator final : public MpiLifetime {
 public:
  PyCommunicator(std::unique_ptr<Communicator> owned, bool is_mpi);
  PyCommunicator(Communicator& world_rank, nanobind::object world);
  ~PyCommunicator() override = default;

  // The communicator; UsageError naming `call` once closed.
  Communicator& get(const char* call);
  bool is_mpi() const { return is_mpi_; }
  void close() noexcept override;

 private:
  std::unique_ptr<Communicator> owned_;
  Communicator* comm_ = nullptr;  // owned_, or the world's; null once closed
  nanobind::object world_;        // the ThreadsWorld, for a rank of one
  bool is_mpi_ = false;
};

void bind_communicators(nanobind::module_& m);

}  // namespace epmoe::python
