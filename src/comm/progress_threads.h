// The threads that run asynchronous collectives (internal to comm/). A
// collective is a blocking algorithm over transport requests; running it on
// its own thread is what lets it progress while the caller computes (the
// transports progress only while someone waits or polls), and is the
// "progress thread" of DESIGN.md §4.4.
//
// One pool per process, shared by all communicators and ranks. A submitted
// task starts at once: on an idle thread if there is one, else on a new
// thread - never queued behind a running collective, because two collectives
// in flight may be started in different orders on different ranks and would
// deadlock if they had to share one thread. Threads are kept for reuse (their
// thread_local scratch too), so the pool grows to the largest number of
// collectives ever in flight at once, and joined at exit.
//
// Scheduling: the threads run at the default priority. Raising it (nice -10,
// a 0.1 ms EEVDF slice, 1 ns timer slack) changed nothing measurable in
// bench_collectives links/overlap on this shared 2-core machine (differences
// within the run-to-run spread of +-30%), so the code does not do it. What
// does help when rank threads fill the cores is the caller lending its core
// (comm/cooperative_progress.h): a woken progress thread otherwise waits for
// the compute thread's slice to end, and the first step runs on the caller
// (launch_collective's prologue).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace epmoe::comm::detail {

class ProgressThreads {
 public:
  static ProgressThreads& instance();

  void submit(std::function<void()> task);

  ~ProgressThreads();  // lets running tasks finish (they are bounded by their deadlines), joins

 private:
  ProgressThreads() = default;
  void run(std::function<void()> first_task);

  std::mutex mutex_;  // guards everything below
  std::condition_variable task_ready_;
  std::deque<std::function<void()>> queued_;  // never longer than idle_
  int idle_ = 0;                              // threads waiting for a task
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace epmoe::comm::detail
