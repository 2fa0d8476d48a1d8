// ProgressSlot (transport/progress_slot.h): when a lender is told "due", and
// that a loan ends when the progress thread parks again or finishes; and the
// threads transport's waits park in the slot with the mailbox epoch, so a
// message's arrival makes its waiter due. No wall-clock assertions: every
// check is a state the protocol must reach (caps and loops only bound a bug).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "transport/progress_slot.h"
#include "transport/threads/communicator.h"

namespace epmoe::transport {
namespace {

using namespace std::chrono_literals;
using Lent = ProgressSlot::Lent;

constexpr auto kCap = 30s;  // a loan that takes this long is a bug, not a slow machine

// Until a lender is blocked in lend() (bounded).
bool wait_for_lender(ProgressSlot& slot) {
  for (int i = 0; i < 1000000; ++i) {
    if (slot.num_lenders() > 0) return true;
    std::this_thread::yield();
  }
  return false;
}

TEST(ProgressSlot, ParkedAndNotDueIsNotLentAndFinishedIsFinished) {
  ProgressSlot slot;
  std::atomic<std::uint64_t> epoch{5};
  slot.park(Clock::now() + 1h, &epoch, epoch.load(), nullptr);
  EXPECT_EQ(slot.lend(kCap), Lent::no);
  EXPECT_EQ(slot.lend(kCap), Lent::no);
  slot.unpark();
  slot.finish();
  EXPECT_TRUE(slot.finished());
  EXPECT_EQ(slot.lend(kCap), Lent::finished);
}

TEST(ProgressSlot, NotifiedSinceParkingIsLentUntilItParksAgain) {
  ProgressSlot slot;
  std::atomic<std::uint64_t> epoch{0};
  slot.park(Clock::now() + 1h, &epoch, 0, nullptr);
  epoch.store(1);  // a notify: the sleeper is runnable now
  std::promise<Lent> lent;
  std::thread lender([&] { lent.set_value(slot.lend(kCap)); });
  ASSERT_TRUE(wait_for_lender(slot));
  // The "progress thread" wakes, does its step, and sleeps on its next wait.
  slot.unpark();
  slot.park(Clock::now() + 1h, &epoch, 1, nullptr);
  EXPECT_EQ(lent.get_future().get(), Lent::yes);
  lender.join();
  // The new park is not due: a later call returns at once.
  EXPECT_EQ(slot.lend(kCap), Lent::no);
}

TEST(ProgressSlot, TimeDueIsLentAndAFinishEndsTheLoan) {
  ProgressSlot slot;
  slot.park(Clock::now() - 1us, nullptr, 0, nullptr);  // its arrival time has passed
  std::promise<Lent> lent;
  std::thread lender([&] { lent.set_value(slot.lend(kCap)); });
  ASSERT_TRUE(wait_for_lender(slot));
  slot.unpark();
  slot.finish();  // the body returned: the loan ends
  EXPECT_EQ(lent.get_future().get(), Lent::yes);
  lender.join();
  EXPECT_EQ(slot.lend(kCap), Lent::finished);
}

// Lends until the answer is `no` (the progress thread has parked and is not
// due); false if it never is (bounded).
bool lend_until_parked(ProgressSlot& slot) {
  for (int i = 0; i < 100000; ++i) {
    if (slot.lend(1ms) == Lent::no) return true;
  }
  return false;
}

TEST(ProgressSlot, APollSleepIsNotDueBeforeItsTimeAndALenderWakesItThen) {
  ProgressSlot slot;
  std::thread poller([&] {
    slot.poll_sleep(Clock::now() + 500ms);
    slot.finish();
  });
  ASSERT_TRUE(lend_until_parked(slot));
  Lent answer = Lent::no;
  for (int i = 0; i < 100000 && answer == Lent::no; ++i) {
    std::this_thread::sleep_for(100us);
    answer = slot.lend(kCap);
  }
  EXPECT_NE(answer, Lent::no);  // due once its time came: lent, or already finished
  poller.join();
  EXPECT_EQ(slot.lend(kCap), Lent::finished);
}

TEST(ProgressSlot, AThreadsTransportReceiveParksAndItsMessageMakesItDue) {
  threads::ThreadsWorld world(2, threads::EmulatedLinkOptions{});
  ProgressSlot slot;
  int received = 0;
  std::thread progress([&] {
    set_this_thread_progress_slot(&slot);
    auto recv = world.communicator(1).irecv(0, 7, &received, sizeof(received));
    recv->wait_until(Clock::now() + 30s);
    set_this_thread_progress_slot(nullptr);
    slot.finish();
  });
  // Parked on the receive (no send yet): not due, however often asked.
  ASSERT_TRUE(lend_until_parked(slot));
  EXPECT_EQ(slot.lend(kCap), Lent::no);
  const int value = 42;
  auto send = world.communicator(0).isend(1, 7, &value, sizeof(value));  // matches: the mailbox epoch moves
  // Due by the epoch: lent until it finishes (or it has finished already,
  // woken by the send's own notify) - never "not due".
  EXPECT_NE(slot.lend(kCap), Lent::no);
  progress.join();
  send->wait(30s);
  EXPECT_EQ(received, 42);
  EXPECT_EQ(slot.lend(kCap), Lent::finished);
}

}  // namespace
}  // namespace epmoe::transport
