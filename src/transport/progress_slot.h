// ProgressSlot: where a thread that runs one collective (a progress thread,
// comm/progress_threads.h) says what it is blocked on, so that the thread
// that launched the collective can tell, without taking any transport lock,
// whether the progress thread could run now - and if so lend it the core
// (comm/cooperative_progress.h, issue 15).
//
// Why: when rank threads fill the cores (R=2 on this 2-core machine), a
// progress thread woken by its message (a timer at the emulated arrival, or a
// notify when the peer's send is posted) becomes runnable but does not run:
// the kernel (6.18, EEVDF, PREEMPT_NONE, HZ=250) lets the compute thread on
// the core finish its slice, checked at the 4 ms tick. Measured (bench
// `overlap`, R=2, 1 MiB): the collective's body started 1.5 ms after launch,
// when the 1.5 ms compute loop ended, in 9 of 12 runs - no overlap at all.
// Lending the core (the launching thread blocks until the progress thread is
// blocked again) needs no change to the algorithms, which stay blocking code.
//
// Protocol. Progress thread, inside a transport wait: park() just before it
// sleeps, unpark() once awake; finish() once the collective's body returned.
// Launching thread: lend(). Parking states what wakes the sleeper: its wake
// time (an emulated arrival, a poll's next try, its deadline) and an epoch
// counter that whoever notifies its condition variable increments first (the
// threads transport's mailbox); so "could run now" is exact: the time has
// come, or it has been notified since it parked.
//
// Lock order: a transport may call park()/unpark() while holding its own
// locks (the mailbox's); lend() holds only the slot's mutex and never takes
// a transport lock (it reads the epoch atomically and notifies the sleeper's
// condition variable without its mutex).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "transport/communicator.h"

namespace epmoe::transport {

class ProgressSlot {
 public:
  // --- the progress thread ---
  // About to sleep until `wake_at` or until `*changed` moves on from `seen`
  // (`changed` may be null: time only); `sleeper` is the condition variable
  // it sleeps on, notified by lend() to cut short its timer's slack (may be
  // null).
  void park(Clock::time_point wake_at, const std::atomic<std::uint64_t>* changed, std::uint64_t seen,
            std::condition_variable* sleeper);
  void unpark();
  // For a transport that polls (mpi): sleeps until `until` on the slot's own
  // condition variable, parked, so that lend() sees when the next poll is
  // due and can wake it then.
  void poll_sleep(Clock::time_point until);
  // The collective's body returned: releases a lender, and lend() says
  // `finished` from now on.
  void finish();

  // --- the launching thread ---
  enum class Lent {
    no,        // parked and not due: returned at once
    yes,       // lent the core (the body may have finished meanwhile)
    finished,  // the body had already finished: returned at once
  };
  // If the progress thread could run now (parked and due, or not parked -
  // running or waiting for a core), yields (up to 200 us) then blocks until
  // it is parked again or finished, at most `cap`, and returns yes; if it is parked and not due,
  // returns no at once (an uncontended mutex and a clock read). Never
  // throws; never waits longer than `cap`, whatever the progress thread does.
  Lent lend(Clock::duration cap);
  bool finished();
  int num_lenders();  // threads blocked in lend() now (a polling transport stops spinning; tests)

 private:
  std::mutex mutex_;                   // guards everything below
  std::condition_variable moved_on_;   // a park or the finish, for a lender
  std::condition_variable poll_wake_;  // poll_sleep's sleep, for lend()
  bool parked_ = false;
  bool finished_ = false;
  bool poked_ = false;       // poll_sleep: lend() wants it up now
  std::uint64_t parks_ = 0;  // parks so far: a lender waits for the next
  int lenders_ = 0;          // threads blocked in lend()
  Clock::time_point wake_at_{};
  const std::atomic<std::uint64_t>* changed_ = nullptr;
  std::uint64_t seen_ = 0;
  std::condition_variable* sleeper_ = nullptr;
};

// The slot of the collective the calling thread is running (set by comm's
// launch_collective on its progress thread for the body's duration); null on
// every other thread, where transport waits park nowhere.
ProgressSlot* this_thread_progress_slot();
// Returns the previous slot.
ProgressSlot* set_this_thread_progress_slot(ProgressSlot* slot);

}  // namespace epmoe::transport
