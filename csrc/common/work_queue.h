// A fixed set of worker threads that run submitted jobs in FIFO order, started on the first
// submit (an engine that never needs them starts none).
//
// Lifecycle: constructed (no thread) -> submit() (threads started up to `threads`) -> stop():
// jobs not yet started are dropped (destroyed unrun, outside the lock), running ones finish,
// every worker is joined; later submits return false. The destructor calls stop(). A job that
// throws ends that job only. When no worker thread can be started, submit() returns false and
// the caller runs the job itself. Never call stop() (or destroy the queue) from one of its jobs.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rdmaxfer {

class WorkQueue {
 public:
  explicit WorkQueue(int threads);
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `job` for a worker; false (job not taken) after stop() or when no worker runs.
  bool submit(std::function<void()> job);
  void stop();

 private:
  void run();

  const int threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> workers_;
  bool stopped_ = false;
};

}  // namespace rdmaxfer
