#include "common/helper_thread.h"

#include <atomic>

namespace strata {

HelperThread::HelperThread() : thread_([this] { Run(); }) {}

HelperThread::~HelperThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HelperThread::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

void HelperThread::Post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void HelperThread::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n <= 1) {
    if (n == 1) fn(0);
    return;
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> helper_done{false};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  Post([&] {
    work();
    helper_done.store(true);
  });
  work();
  while (!helper_done.load()) std::this_thread::yield();  // it may still be using `fn`
}

}  // namespace strata
