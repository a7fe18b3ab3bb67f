// What the staging pipeline needs from "the device": asynchronous copies between device memory
// and host bounce slabs (transport/bounce_pool.h makes those), and a way to know when each has
// finished.
//
// Two implementations: CudaCopier (cuMemcpy*Async on a CUDA stream, one event per slot) and
// HostCopier (memcpy on a worker thread: host memory standing in for the device, so the
// pipeline's logic runs in CI without a GPU, over the real transports).
//
// Lifecycle: a DeviceCopier is shared by the pipelines of one device (one per Stager). Each
// pipeline opens a CopyLane with N slots (one per bounce buffer), calls bind_thread() on the
// thread that drives it, starts at most one copy per slot at a time, and polls ready() or
// wait()s (bounded) for it. Destroying a lane waits for its copies to leave the bounce buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace rdmaxfer {

class CopyLane {
 public:
  virtual ~CopyLane() = default;
  // Starts copying `length` bytes from device address `src` into host `dst` (slot idle).
  virtual void to_host(int slot, uint8_t* dst, uint64_t src, uint64_t length) = 0;
  // Starts copying `length` bytes from host `src` to device address `dst` (slot idle).
  virtual void to_device(int slot, uint64_t dst, const uint8_t* src, uint64_t length) = 0;
  // True when the slot's last copy finished (or none was started); throws Error when it failed.
  virtual bool ready(int slot) = 0;
  // Waits up to `timeout_s` for the slot's copy; true when finished. Throws Error on failure.
  virtual bool wait(int slot, double timeout_s) = 0;
};

class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  virtual std::string describe() const = 0;
  virtual std::unique_ptr<CopyLane> open_lane(int slots) = 0;
  // Prepares the calling thread for copies (makes the CUDA context current).
  virtual void bind_thread() {}
};

}  // namespace rdmaxfer
