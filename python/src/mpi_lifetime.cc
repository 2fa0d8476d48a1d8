#include "mpi_lifetime.h"

namespace epmoe::python {
namespace {

// Guarded by the GIL: every object is made and destroyed with it held.
std::list<MpiLifetime*>& live_objects() {
  static auto* objects = new std::list<MpiLifetime*>();  // never destroyed: objects may outlive static teardown
  return *objects;
}

}  // namespace

MpiLifetime::~MpiLifetime() {
  if (tracked_) live_objects().erase(position_);
}

void MpiLifetime::track(bool on_mpi) {
  if (!on_mpi || tracked_) return;
  live_objects().push_back(this);
  position_ = std::prev(live_objects().end());
  tracked_ = true;
}

void MpiLifetime::close_all() noexcept {
  std::list<MpiLifetime*>& objects = live_objects();
  while (!objects.empty()) {
    MpiLifetime* newest = objects.back();
    objects.pop_back();
    newest->tracked_ = false;
    newest->close();
  }
}

}  // namespace epmoe::python
