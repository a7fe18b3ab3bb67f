#include "cuda/host_copier.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"

namespace rdmaxfer {

namespace {

class HostLane : public CopyLane {
 public:
  HostLane(int slots, const HostCopierFaults& faults, std::shared_ptr<std::atomic<int64_t>> counter)
      : faults_(faults), counter_(std::move(counter)), slots_(static_cast<size_t>(slots)) {
    worker_ = std::thread([this] { run(); });
  }
  ~HostLane() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  HostLane(const HostLane&) = delete;
  HostLane& operator=(const HostLane&) = delete;

  void to_host(int slot, uint8_t* dst, uint64_t src, uint64_t length) override {
    start(slot, dst, reinterpret_cast<const uint8_t*>(src), length);
  }
  void to_device(int slot, uint64_t dst, const uint8_t* src, uint64_t length) override {
    start(slot, reinterpret_cast<uint8_t*>(dst), src, length);
  }
  bool ready(int slot) override {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_locked(slot);
  }
  bool wait(int slot, double timeout_s) override {
    std::unique_lock<std::mutex> lock(mu_);
    bool done = false;
    cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                 [&] { return (done = finished_locked(slot)); });
    return done;
  }

 private:
  struct Job {
    size_t slot;
    uint8_t* dst;
    const uint8_t* src;
    uint64_t length;
    int64_t number;
  };
  struct Slot {
    uint64_t started = 0;
    uint64_t finished = 0;
    std::string error;
  };

  Slot& slot_at(int slot) {
    if (slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
      throw Error(ErrorKind::kInvalidArgument, "copy slot " + std::to_string(slot) + " out of range");
    }
    return slots_[static_cast<size_t>(slot)];
  }

  void start(int slot, uint8_t* dst, const uint8_t* src, uint64_t length) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Slot& s = slot_at(slot);
      if (s.started != s.finished) {
        throw Error(ErrorKind::kInvalidArgument,
                    "copy slot " + std::to_string(slot) + " already has a copy in flight");
      }
      s.started++;
      queue_.push_back(Job{static_cast<size_t>(slot), dst, src, length, counter_->fetch_add(1)});
    }
    cv_.notify_all();
  }

  // Throws the slot's recorded failure once (then the slot is idle again).
  bool finished_locked(int slot) {
    Slot& s = slot_at(slot);
    if (!s.error.empty()) {
      std::string error = std::move(s.error);
      s.error.clear();
      throw Error(ErrorKind::kTransport, error);
    }
    return s.started == s.finished;
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      Job job = queue_.front();
      queue_.pop_front();
      lock.unlock();
      std::string error;
      if (faults_.delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(faults_.delay_us));
      if (job.number == faults_.hang_at) {
        lock.lock();
        cv_.wait(lock, [&] { return stop_; });  // never completes: the lane is being destroyed
        return;
      }
      if (job.number == faults_.fail_at) {
        error = "host copier: injected failure of copy #" + std::to_string(job.number) + " (" +
                std::to_string(job.length) + " bytes)";
      } else if (job.length > 0) {
        std::memcpy(job.dst, job.src, job.length);
      }
      lock.lock();
      Slot& s = slots_[job.slot];
      s.finished++;
      if (!error.empty()) s.error = error;
      cv_.notify_all();
    }
  }

  const HostCopierFaults faults_;
  std::shared_ptr<std::atomic<int64_t>> counter_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<Slot> slots_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace

HostCopier::HostCopier(const HostCopierFaults& faults)
    : faults_(faults), counter_(std::make_shared<std::atomic<int64_t>>(0)) {}

std::string HostCopier::describe() const { return "host copier (memcpy on a worker thread)"; }

std::unique_ptr<CopyLane> HostCopier::open_lane(int slots) {
  return std::make_unique<HostLane>(slots, faults_, counter_);
}

}  // namespace rdmaxfer
