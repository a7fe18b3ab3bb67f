// One GPU's primary context, and what the driver says about the GPU.
//
// Lifecycle of a CudaContext: constructed (cuDevicePrimaryCtxRetain: the same context the
// CUDA runtime, CuPy and PyTorch use on that device) -> bind() on every thread that issues CUDA
// calls (cuCtxSetCurrent) -> destroyed (cuDevicePrimaryCtxRelease). Everything allocated in the
// context holds a shared_ptr to it, so the context outlives its memory, streams and events.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_types.h"

namespace rdmaxfer {

class CudaContext {
 public:
  // Throws Error(kUnsupported) without CUDA, Error(kInvalidArgument) for a bad ordinal.
  explicit CudaContext(int ordinal);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  // The shared context of `ordinal` (one per device per process).
  static std::shared_ptr<CudaContext> get(int ordinal);

  int ordinal() const { return ordinal_; }
  CUdevice device() const { return device_; }
  // Makes the context current on the calling thread.
  void bind() const;

 private:
  int ordinal_;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
};

struct GpuInfo {
  int ordinal = 0;
  std::string name;
  std::string pci_bus_id;  // "0000:3b:00.0" (lower case; cuDeviceGetPCIBusId)
  uint64_t total_memory = 0;
  int cc_major = 0;
  int cc_minor = 0;
  bool gpu_direct_rdma = false;  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
  bool dma_buf = false;          // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
  // The other GPUs whose memory this one can access directly (cuDeviceCanAccessPeer): CUDA
  // IPC copies between them go peer to peer, else the driver stages them through host memory.
  std::vector<int> peers;
};

struct CudaStatus {
  std::string unavailable;  // "" when usable, else why not ("no CUDA: ...")
  int driver_version = 0;   // 12040 = 12.4
  bool get_handle_for_address_range = false;  // cuMemGetHandleForAddressRange (>= 11.7)
  std::string cuda_ipc;  // "" when the driver offers CUDA IPC, else why not (cuda_api.h)
  bool can_access_peer = false;  // cuDeviceCanAccessPeer is there (GpuInfo::peers is known)
  std::vector<GpuInfo> gpus;
};

// What `rdmaxfer info` reports; never throws.
CudaStatus cuda_status();

}  // namespace rdmaxfer
