// Objects that must end before MPI_Finalize. An epmoe communicator over MPI
// runs a liveness thread that calls MPI until the communicator is destroyed,
// and a group, layer, step or dispatch handle on it must end before it does.
// mpi4py finalises MPI at interpreter exit (after Python's atexit handlers),
// when Python may still hold any of these (a module global, a step kept by
// an autograd graph). So every object on an MPI communicator registers
// here, and an atexit handler (python/epmoe/_mpi.py) closes the live ones in
// reverse order of creation, which is a valid order: each was made after
// whatever it depends on. A closed object refuses every later call.
//
// Objects on a threads world are not registered: Python's references alone
// order their ends (a step holds its layer, a layer its group, ...).
#pragma once

#include <list>

namespace epmoe::python {

class MpiLifetime {
 public:
  MpiLifetime() = default;
  MpiLifetime(const MpiLifetime&) = delete;
  MpiLifetime& operator=(const MpiLifetime&) = delete;
  virtual ~MpiLifetime();

  // Ends the object's C++ state (idempotent, never throws).
  virtual void close() noexcept = 0;

  // Closes every registered object, newest first. The GIL is held.
  static void close_all() noexcept;

 protected:
  // Registers this object when `on_mpi`; the destructor unregisters it.
  void track(bool on_mpi);

 private:
  bool tracked_ = false;
  std::list<MpiLifetime*>::iterator position_;
};

}  // namespace epmoe::python
