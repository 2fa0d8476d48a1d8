// Cooperative progress (issue 15): compute code that has collectives in
// flight calls drive_progress() between GEMM groups or tiles, and the
// collectives advance even when rank threads fill every core.
//
// Why it is needed: a collective runs as a blocking algorithm on a progress
// thread (comm/progress_threads.h) that sleeps until its next message is due.
// With as many busy rank threads as cores the woken progress thread waits for
// the compute thread to be descheduled - on this machine's kernel at the next
// 4 ms tick at best, usually only when the compute thread blocks in wait()
// (transport/progress_slot.h has the measurement) - so the collective
// serialises after the compute it was meant to hide behind.
//
// What it does: for each collective launched from the calling thread and not
// yet finished, if its progress thread could run now (its message is due, it
// was woken, or it has just been launched and not yet got a core), the
// caller blocks until that progress thread is asleep again or done, so the
// kernel gives it the caller's core; the algorithms themselves are
// untouched, so results are bit-identical with or without it (tested,
// tests/comm/cooperative_progress_test.cc). Each loan is bounded (kMaxLoan),
// so a call never waits for a peer, never deadlocks, and never throws:
// errors still surface from the handles' wait()/test().
//
// Cost: no collective in flight from this thread - a thread_local vector's
// empty() (~1 ns). In flight but nothing due - per collective one
// uncontended mutex and one steady_clock read (~50 ns). A loan - two context
// switches plus the progress thread's step (its copies, its sums): work the
// caller would have waited for anyway, done now instead of after the
// compute. Call it every 20-100 us of compute: the delay a due step waits is
// at most one interval.
//
// Which thread: the one that launched the collectives (the rank's thread),
// between its compute calls - not from inside an OpenMP region's workers,
// whose own thread_local list is empty (a no-op there). No effect in
// clock=modelled (progress there is perfect by construction) or on
// collectives run natively by MPI (they have no progress thread).
#pragma once

#include <chrono>
#include <memory>

#include "transport/communicator.h"
#include "transport/progress_slot.h"

namespace epmoe::comm {

// The longest one call lends its core to one collective: a progress thread's
// step is a copy or a sum of one message (tens to hundreds of us at MiB
// sizes); if the kernel runs something else meanwhile the caller gets its
// core back after this and tries again at its next call.
constexpr std::chrono::microseconds kMaxLoan{2000};

// Lends the calling thread's core to its collectives that can run now (above).
// Returns how many loans it made (0: nothing was due; a statistic for
// benchmarks, not a correctness signal).
int drive_progress();

namespace detail {
// launch_collective, on the launching thread: the slot of a collective now in
// flight from this thread (finished ones are dropped here and in drive_progress).
void track_in_flight(std::shared_ptr<transport::ProgressSlot> slot);
// Collectives launched from the calling thread whose bodies have not finished
// yet, as far as this thread has seen (tests).
int num_in_flight();
}  // namespace detail

}  // namespace epmoe::comm
