#include "comm/progress_threads.h"

#include <chrono>

namespace epmoe::comm::detail {

ProgressThreads& ProgressThreads::instance() {
  static ProgressThreads pool;
  return pool;
}

void ProgressThreads::submit(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (idle_ > static_cast<int>(queued_.size())) {
    queued_.push_back(std::move(task));
    task_ready_.notify_one();
    return;
  }
  threads_.emplace_back([this, first = std::move(task)]() mutable { run(std::move(first)); });
}

void ProgressThreads::run(std::function<void()> first_task) {
  first_task();
  first_task = nullptr;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ++idle_;
    // An idle pool thread waits for work, not for a peer; the timeout only
    // bounds each sleep so no wait in comm/ is unbounded.
    while (queued_.empty() && !stopping_) task_ready_.wait_for(lock, std::chrono::seconds(1));
    --idle_;
    if (queued_.empty()) return;  // stopping
    std::function<void()> task = std::move(queued_.front());
    queued_.pop_front();
    lock.unlock();
    task();
    task = nullptr;
    lock.lock();
  }
}

ProgressThreads::~ProgressThreads() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    threads.swap(threads_);
    task_ready_.notify_all();
  }
  for (auto& thread : threads) thread.join();
}

}  // namespace epmoe::comm::detail
