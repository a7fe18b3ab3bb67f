// HostCopier: a DeviceCopier whose "device" is host memory. Copies run as memcpy on one worker
// thread per lane, in the order they were started (like a CUDA stream), so the staging
// pipeline's overlap, ordering, errors and timeouts are exercised without a GPU.
//
// Fault injection for tests: `delay_us` per copy, the copy numbered `fail_at` (0-based, counted
// over the copier's life) fails with an error, the copy numbered `hang_at` never completes
// (until its lane is destroyed).
//
// Lifecycle of a lane: worker thread started -> copies queued and run in order -> destroyed:
// the worker stops after the copy it is running (a hung copy is abandoned) and is joined.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "cuda/device_copier.h"

namespace rdmaxfer {

struct HostCopierFaults {
  int64_t delay_us = 0;
  int64_t fail_at = -1;
  int64_t hang_at = -1;
};

class HostCopier : public DeviceCopier {
 public:
  explicit HostCopier(const HostCopierFaults& faults);
  std::string describe() const override;
  std::unique_ptr<CopyLane> open_lane(int slots) override;
  uint64_t copies_started() const { return counter_->load(); }

 private:
  HostCopierFaults faults_;
  std::shared_ptr<std::atomic<int64_t>> counter_;
};

}  // namespace rdmaxfer
