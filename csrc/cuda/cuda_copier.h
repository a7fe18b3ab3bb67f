// CudaCopier: the staging pipeline's copies on a GPU. Each lane has its own non-blocking stream
// and one event per slot: a copy is cuMemcpy{DtoH,HtoD}Async on the lane's stream followed by
// cuEventRecord on the slot's event, and completion is cuEventQuery on that event; nothing
// synchronizes the device or the context. The bounce slabs are cuMemHostAlloc'd (page-locked; transport/bounce_pool.h),
// so the copies run on the copy engines while the wire moves other chunks.
//
// Lifecycle of a lane: stream + events created -> copies -> destroyed: the stream is
// synchronized first (its copies may still be writing a bounce buffer that is about to be
// reused or freed), then events and stream are destroyed.
#pragma once

#include <memory>

#include "cuda/cuda_context.h"
#include "cuda/device_copier.h"

namespace rdmaxfer {

class CudaCopier : public DeviceCopier {
 public:
  explicit CudaCopier(int ordinal);
  std::string describe() const override;
  std::unique_ptr<CopyLane> open_lane(int slots) override;
  void bind_thread() override;
  const std::shared_ptr<CudaContext>& context() const { return ctx_; }

 private:
  std::shared_ptr<CudaContext> ctx_;
};

}  // namespace rdmaxfer
