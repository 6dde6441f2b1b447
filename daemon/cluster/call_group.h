// Waits for a set of gRPC callback-API calls, each of which must call Done() exactly once.
#pragma once

#include <condition_variable>
#include <mutex>

namespace strata::daemon {

class CallGroup {
 public:
  void Add() {
    std::lock_guard<std::mutex> lock(mu_);
    ++pending_;
  }
  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) cv_.notify_all();
  }
  // Every call carries a deadline, so its callback always comes; this only waits for them.
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int pending_ = 0;
};

}  // namespace strata::daemon
