// CUDA streams and events (RAII).
//
// CudaStream: a non-blocking stream (it never waits for the legacy default stream) in a
// CudaContext. Lifecycle: cuStreamCreate -> work enqueued -> cuStreamDestroy (pending work
// still completes; the driver defers the release).
// CudaEvent: an event without timing, recorded on a stream after an async copy; query() polls
// it (CUDA_ERROR_NOT_READY is "in progress", not an error), wait() blocks until it completes.
#pragma once

#include <memory>

#include "cuda/cuda_context.h"

namespace rdmaxfer {

class CudaStream {
 public:
  explicit CudaStream(std::shared_ptr<CudaContext> ctx);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  CUstream get() const { return stream_; }
  void synchronize() const;

 private:
  std::shared_ptr<CudaContext> ctx_;
  CUstream stream_ = nullptr;
};

class CudaEvent {
 public:
  explicit CudaEvent(std::shared_ptr<CudaContext> ctx);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void record(CUstream stream);
  // True when the work recorded before the event finished; throws Error on a failed copy.
  bool query() const;
  void synchronize() const;

 private:
  std::shared_ptr<CudaContext> ctx_;
  CUevent event_ = nullptr;
};

// cuStreamSynchronize on a foreign stream handle (a __cuda_array_interface__ "stream": 1 is the
// legacy default stream, 2 the per-thread one, else a cudaStream_t), in `ordinal`'s context.
void synchronize_stream_handle(int ordinal, uintptr_t handle);

}  // namespace rdmaxfer
