#include "cuda/cuda_stream.h"

#include "common/error.h"
#include "cuda/cuda_api.h"

namespace rdmaxfer {

CudaStream::CudaStream(std::shared_ptr<CudaContext> ctx) : ctx_(std::move(ctx)) {
  ctx_->bind();
  check_cuda(cuda().stream_create(&stream_, kStreamNonBlocking), "cuStreamCreate");
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) cuda().stream_destroy(stream_);
}

void CudaStream::synchronize() const {
  check_cuda(cuda().stream_synchronize(stream_), "cuStreamSynchronize");
}

CudaEvent::CudaEvent(std::shared_ptr<CudaContext> ctx) : ctx_(std::move(ctx)) {
  ctx_->bind();
  check_cuda(cuda().event_create(&event_, kEventDisableTiming), "cuEventCreate");
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) cuda().event_destroy(event_);
}

void CudaEvent::record(CUstream stream) {
  check_cuda(cuda().event_record(event_, stream), "cuEventRecord");
}

bool CudaEvent::query() const {
  const CUresult r = cuda().event_query(event_);
  if (r == kCudaErrorNotReady) return false;
  check_cuda(r, "cuEventQuery (an asynchronous copy failed)");
  return true;
}

void CudaEvent::synchronize() const {
  check_cuda(cuda().event_synchronize(event_), "cuEventSynchronize");
}

void synchronize_stream_handle(int ordinal, uintptr_t handle) {
  auto ctx = CudaContext::get(ordinal);
  ctx->bind();
  check_cuda(cuda().stream_synchronize(stream_from_handle(handle)),
             "cuStreamSynchronize(stream " + std::to_string(handle) + ")");
}

}  // namespace rdmaxfer
