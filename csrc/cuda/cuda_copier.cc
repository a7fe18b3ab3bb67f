#include "cuda/cuda_copier.h"

#include <sched.h>

#include <chrono>
#include <thread>
#include <vector>

#include "common/error.h"
#include "cuda/cuda_api.h"
#include "cuda/cuda_memory.h"
#include "cuda/cuda_stream.h"

namespace rdmaxfer {

namespace {

class CudaLane : public CopyLane {
 public:
  CudaLane(std::shared_ptr<CudaContext> ctx, int slots) : ctx_(ctx), stream_(ctx) {
    for (int i = 0; i < slots; ++i) {
      events_.push_back(std::make_unique<CudaEvent>(ctx));
      busy_.push_back(false);
    }
  }
  ~CudaLane() override {
    try {
      ctx_->bind();
      stream_.synchronize();
    } catch (const Error&) {
      // A failed copy left the stream in error; nothing is running on it any more.
    }
  }
  CudaLane(const CudaLane&) = delete;
  CudaLane& operator=(const CudaLane&) = delete;

  void to_host(int slot, uint8_t* dst, uint64_t src, uint64_t length) override {
    check_slot(slot);
    if (length > 0) {
      check_cuda(cuda().memcpy_dtoh_async(dst, src, length, stream_.get()), "cuMemcpyDtoHAsync");
    }
    record(slot);
  }
  void to_device(int slot, uint64_t dst, const uint8_t* src, uint64_t length) override {
    check_slot(slot);
    if (length > 0) {
      check_cuda(cuda().memcpy_htod_async(dst, src, length, stream_.get()), "cuMemcpyHtoDAsync");
    }
    record(slot);
  }
  bool ready(int slot) override {
    check_slot(slot);
    const size_t i = static_cast<size_t>(slot);
    if (!busy_[i]) return true;
    if (!events_[i]->query()) return false;
    busy_[i] = false;
    return true;
  }
  bool wait(int slot, double timeout_s) override {
    // Polls the event (cuEventSynchronize has no timeout): spin briefly, then short sleeps.
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(timeout_s));
    for (;;) {
      if (ready(slot)) return true;
      const auto now = std::chrono::steady_clock::now();
      if (now >= until) return false;
      if (now - start < std::chrono::microseconds(50)) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

 private:
  void check_slot(int slot) const {
    if (slot < 0 || static_cast<size_t>(slot) >= events_.size()) {
      throw Error(ErrorKind::kInvalidArgument, "copy slot " + std::to_string(slot) + " out of range");
    }
  }
  void record(int slot) {
    const size_t i = static_cast<size_t>(slot);
    events_[i]->record(stream_.get());
    busy_[i] = true;
  }

  std::shared_ptr<CudaContext> ctx_;
  CudaStream stream_;
  std::vector<std::unique_ptr<CudaEvent>> events_;
  std::vector<bool> busy_;
};

}  // namespace

CudaCopier::CudaCopier(int ordinal) : ctx_(CudaContext::get(ordinal)) {}

std::string CudaCopier::describe() const {
  return "CUDA copier on cuda:" + std::to_string(ctx_->ordinal()) +
         " (cuMemcpyAsync on a stream, events per bounce buffer)";
}

std::unique_ptr<CopyLane> CudaCopier::open_lane(int slots) {
  ctx_->bind();
  return std::make_unique<CudaLane>(ctx_, slots);
}

void CudaCopier::bind_thread() { ctx_->bind(); }

}  // namespace rdmaxfer
