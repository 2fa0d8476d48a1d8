#include "transport/progress_slot.h"

#include <algorithm>
#include <thread>

namespace epmoe::transport {
namespace {

thread_local ProgressSlot* tls_progress_slot = nullptr;

// How long lend() yields before it sleeps (above): a progress thread's step
// (a copy, a wake-up) mostly fits.
constexpr auto kLendSpin = std::chrono::microseconds(200);

}  // namespace

ProgressSlot* this_thread_progress_slot() { return tls_progress_slot; }

ProgressSlot* set_this_thread_progress_slot(ProgressSlot* slot) {
  ProgressSlot* const previous = tls_progress_slot;
  tls_progress_slot = slot;
  return previous;
}

void ProgressSlot::park(Clock::time_point wake_at, const std::atomic<std::uint64_t>* changed, std::uint64_t seen,
                        std::condition_variable* sleeper) {
  std::lock_guard<std::mutex> lock(mutex_);
  parked_ = true;
  wake_at_ = wake_at;
  changed_ = changed;
  seen_ = seen;
  sleeper_ = sleeper;
  ++parks_;
  if (lenders_ > 0) moved_on_.notify_all();  // the lender gets its core back
}

void ProgressSlot::unpark() {
  std::lock_guard<std::mutex> lock(mutex_);
  parked_ = false;
  changed_ = nullptr;
  sleeper_ = nullptr;
}

void ProgressSlot::poll_sleep(Clock::time_point until) {
  std::unique_lock<std::mutex> lock(mutex_);
  parked_ = true;
  wake_at_ = until;
  changed_ = nullptr;
  sleeper_ = &poll_wake_;
  poked_ = false;
  ++parks_;
  if (lenders_ > 0) moved_on_.notify_all();
  poll_wake_.wait_until(lock, until, [&] { return poked_; });
  parked_ = false;
  sleeper_ = nullptr;
}

void ProgressSlot::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  finished_ = true;
  parked_ = false;
  changed_ = nullptr;
  sleeper_ = nullptr;
  if (lenders_ > 0) moved_on_.notify_all();
}

bool ProgressSlot::finished() {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

int ProgressSlot::num_lenders() {
  std::lock_guard<std::mutex> lock(mutex_);
  return lenders_;
}

ProgressSlot::Lent ProgressSlot::lend(Clock::duration cap) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (finished_) return Lent::finished;
  const Clock::time_point now = Clock::now();
  if (parked_) {
    const bool due = now >= wake_at_ || (changed_ != nullptr && changed_->load(std::memory_order_acquire) != seen_);
    if (!due) return Lent::no;
    // Up now rather than when its timer fires (timer slack, ~50 us): a
    // notify without the sleeper's mutex is allowed, and the sleeper
    // rechecks its own condition, so a spare wake-up is harmless. The
    // condition variable outlives the park: it is the transport's (its
    // mailbox's) or this slot's, and unpark() clears it under mutex_.
    poked_ = true;
    if (sleeper_ != nullptr) sleeper_->notify_all();
  }
  // Not parked: running, or runnable and waiting for a core - the case of a
  // body just launched, or woken by the kernel and not yet scheduled. Either
  // way it parks again or finishes soon; this thread's core is what it lacks.
  const std::uint64_t parks = parks_;
  ++lenders_;
  const auto moved_on = [&] { return finished_ || parks_ != parks; };
  // First yield rather than sleep: a sleeping lender lets the kernel give
  // the core to any process, and when the progress thread parks the woken
  // lender waits for that process's slice (up to a 4 ms tick here); a
  // yielding one stays runnable, so the core goes to the other runnable
  // threads of this process - the progress thread - and comes back at once.
  const Clock::time_point spin_end = std::min(now + kLendSpin, now + cap);
  while (!moved_on() && Clock::now() < spin_end) {
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
  moved_on_.wait_until(lock, now + cap, moved_on);
  --lenders_;
  return Lent::yes;
}

}  // namespace epmoe::transport
