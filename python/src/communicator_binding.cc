#include "communicator_binding.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <cstdint>
#include <string>
#include <utility>

#include <epmoe/error.h>
#include <epmoe/threads_world.h>
#include "core/threading.h"

#ifdef EPMOE_PYTHON_WITH_MPI
#include <epmoe/mpi_communicator.h>
#endif

namespace nb = nanobind;

namespace epmoe::python {

PyCommunicator::PyCommunicator(std::unique_ptr<Communicator> owned, bool is_mpi)
    : owned_(std::move(owned)), comm_(owned_.get()), is_mpi_(is_mpi) {
  track(is_mpi_);
}

PyCommunicator::PyCommunicator(Communicator& world_rank, nb::object world)
    : comm_(&world_rank), world_(std::move(world)) {}

Communicator& PyCommunicator::get(const char* call) {
  if (comm_ == nullptr) {
    throw UsageError(std::string("Communicator.") + call +
                     "(): the communicator was closed at interpreter exit (MPI is finalised next)");
  }
  return *comm_;
}

void PyCommunicator::close() noexcept {
  comm_ = nullptr;
  owned_.reset();  // MPI: joins the liveness thread and frees the duplicates
}

namespace {

#ifdef EPMOE_PYTHON_WITH_MPI
// `handle`: the MPI_Comm of an mpi4py communicator as an integer
// (MPI._handleof(comm), or comm.handle on mpi4py >= 4); OpenMPI's MPI_Comm
// is a pointer. MPI_Comm_dup inside is collective: the GIL is released so
// that the process's other Python threads run meanwhile.
std::unique_ptr<PyCommunicator> mpi_communicator(std::uintptr_t handle) {
  const MPI_Comm comm = reinterpret_cast<MPI_Comm>(handle);
  std::unique_ptr<Communicator> made;
  {
    nb::gil_scoped_release release;
    made = make_mpi_communicator(comm);
  }
  return std::make_unique<PyCommunicator>(std::move(made), /*is_mpi=*/true);
}

// The MPI library epmoe was linked with (callable before MPI_Init), to check
// that mpi4py's is the same one.
std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}
#endif

}  // namespace

void bind_communicators(nb::module_& m) {
  nb::class_<PyCommunicator>(m, "Communicator", nb::is_weak_referenceable())
      .def_prop_ro("rank", [](PyCommunicator& c) { return c.get("rank").rank(); })
      .def_prop_ro("size", [](PyCommunicator& c) { return c.get("size").size(); })
      .def_prop_ro("transport", [](PyCommunicator& c) { return std::string(c.get("transport").transport_name()); })
      .def(
          "abort",
          [](PyCommunicator& c, const std::string& reason) {
            Communicator& comm = c.get("abort");
            nb::gil_scoped_release release;  // mpi: ends the job and never returns
            comm.abort(reason);
          },
          nb::arg("reason"))
      .def("_close", &PyCommunicator::close);

  nb::class_<ThreadsWorld>(m, "ThreadsWorld")
      .def(nb::init<int>(), nb::arg("num_ranks"))
      .def_prop_ro("size", &ThreadsWorld::size)
      .def_prop_ro("aborted", &ThreadsWorld::aborted)
      .def(
          "communicator",
          [](nb::pointer_and_handle<ThreadsWorld> world, int rank) {
            return std::make_unique<PyCommunicator>(world.p->communicator(rank), nb::borrow(world.h));
          },
          nb::arg("rank"));

  m.def("_close_mpi_objects", &MpiLifetime::close_all);
  m.def(
      "set_compute_threads",
      [](int num_threads) {
        if (num_threads < 1)
          throw ConfigError("set_compute_threads(" + std::to_string(num_threads) + "): must be >= 1");
        set_compute_threads(num_threads);
      },
      nb::arg("num_threads"));
  m.def("compute_threads", [] { return compute_threads(); });
#ifdef EPMOE_PYTHON_WITH_MPI
  m.attr("has_mpi") = true;
  m.def("mpi_communicator", &mpi_communicator, nb::arg("handle"));
  m.def("mpi_library_version", &mpi_library_version);
#else
  m.attr("has_mpi") = false;
#endif
}

}  // namespace epmoe::python
