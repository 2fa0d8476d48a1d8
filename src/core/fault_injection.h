// Fault injection: a test hook, documented as such (docs/RELIABILITY.md),
// that makes rank r fail at a named point of its work so the tests can show
// that a failure on one rank reaches every rank at once.
//
// Spec (key `fault_injection=` of the epmoe tool, or the environment variable
// EPMOE_FAULT_INJECTION, which mpirun passes on with -x):
//
//     RANK:POINT[:ACTION[:NTH]]
//
//   RANK    the rank that fails (0-based)
//   POINT   where: `collective` (inside a collective's algorithm, with its
//           messages in flight), `dispatch` (inside an EP dispatcher between
//           posting the token exchange and waiting for it), `checkpoint`
//           (between writing a checkpoint's files and committing it), or any
//           other name passed to fault_point()
//   ACTION  throw (default: an InjectedFault, a recoverable epmoe::Error),
//           kill (SIGKILL to the own process), stop (SIGSTOP to the own
//           process: a rank that stops responding)
//   NTH     fail at the NTH time the rank reaches the point (default 1)
//
// Cost when no fault is configured: one relaxed atomic load per point.
#pragma once

#include <string>
#include <string_view>

#include "core/error.h"

namespace epmoe {

class InjectedFault : public Error {
 public:
  using Error::Error;
};

// Sets the process-wide spec ("" clears it). Throws ConfigError naming the
// key and the rule when the spec is malformed. Resets the hit counters.
void configure_fault_injection(std::string_view spec);

// The spec in force ("" when none): from configure_fault_injection, else from
// EPMOE_FAULT_INJECTION read at the first fault_point().
std::string fault_injection_spec();

// Called at each named point of the work of `rank`; fails as configured when
// (rank, point) matches for the NTH time, else returns at once.
void fault_point(std::string_view point, int rank);

}  // namespace epmoe
