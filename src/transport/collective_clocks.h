// What comm/ needs of a modelled clock to run collectives on it (clock=
// modelled, DESIGN.md §4.11): each collective in flight is a stream with its
// own virtual clock, forked from its caller's at launch - its messages
// progress at link speed however long the caller computes, as a DMA engine's
// do - and a caller that waits for it jumps to max(its clock, the
// collective's end). Implemented by the threads transport's VirtualTimeline;
// Communicator::collective_clocks() is nullptr in wall time.
#pragma once

#include <memory>
#include <string>

#include "core/modelled_clock.h"

namespace epmoe::transport {

class CollectiveClocks {
 public:
  virtual ~CollectiveClocks() = default;
  // A clock for a collective launched now by the calling thread (which must
  // run on a modelled clock), starting at the caller's time.
  virtual std::shared_ptr<ModelledClock> fork(const std::string& name) = 0;
  // The collective's body has ended (on its progress thread).
  virtual void finish(ModelledClock& collective) = 0;
  // The calling thread blocks until `collective` finished, then takes
  // max(its clock, the collective's end) and books the wait as idle or
  // communication. end_wait may be called after a failed collective too.
  virtual void begin_wait(ModelledClock& collective) = 0;
  virtual void end_wait(ModelledClock& collective) = 0;
};

}  // namespace epmoe::transport
