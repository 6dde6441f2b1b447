// A second thread beside the caller's: in the client, CRC checks of fetched blocks run on it
// while later blocks are still moving, and codec work is split between it and the caller; in
// stratad, large staged blocks are copied half on it, half on the progress thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace strata {

class HelperThread {
 public:
  HelperThread();
  ~HelperThread();  // runs the jobs still queued, then joins
  HelperThread(const HelperThread&) = delete;
  HelperThread& operator=(const HelperThread&) = delete;

  // Runs `job` on the helper thread, after the jobs posted before it.
  void Post(std::function<void()> job);

  // Runs fn(i) for every i in [0, n) on the calling thread and the helper thread; returns once
  // both are done with `fn`.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace strata
