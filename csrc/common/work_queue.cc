#include "common/work_queue.h"

#include <system_error>
#include <utility>

namespace rdmaxfer {

WorkQueue::WorkQueue(int threads) : threads_(threads < 1 ? 1 : threads) {}

WorkQueue::~WorkQueue() { stop(); }

bool WorkQueue::submit(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return false;
  if (static_cast<int>(workers_.size()) < threads_) {
    try {
      workers_.emplace_back([this] { run(); });
    } catch (const std::system_error&) {
      if (workers_.empty()) return false;  // the caller runs it; the workers that run go on
    }
  }
  jobs_.push_back(std::move(job));
  cv_.notify_one();
  return true;
}

void WorkQueue::run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopped_ || !jobs_.empty(); });
      if (stopped_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    try {
      job();
    } catch (...) {
      // A job reports its own failures; one that escapes ends that job only.
    }
  }
}

void WorkQueue::stop() {
  std::deque<std::function<void()>> dropped;
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    dropped.swap(jobs_);
    workers.swap(workers_);
  }
  cv_.notify_all();
  dropped.clear();
  for (auto& t : workers) t.join();
}

}  // namespace rdmaxfer
