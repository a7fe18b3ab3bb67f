// GPU memory, page-locked host memory, and what a pointer points at.
//
// DeviceAllocation: cuMemAlloc'd device memory. Lifecycle: allocated (context bound) -> freed
// by cuMemFree on destruction. Holds its CudaContext.
// PinnedHostAllocation: cuMemHostAlloc'd page-locked host memory (portable to every context),
// what the staging pipeline's bounce buffers are made of, so that cuMemcpy*Async really runs
// asynchronously on the copy engine. Freed by cuMemFreeHost.
// DmabufFd: the dmabuf file descriptor of a device address range
// (cuMemGetHandleForAddressRange), for ibv_reg_dmabuf_mr; closed on destruction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/unique_fd.h"
#include "cuda/cuda_context.h"

namespace rdmaxfer {

class DeviceAllocation {
 public:
  // Throws Error(kRegistration) when the GPU is out of memory (the message gives the size).
  DeviceAllocation(std::shared_ptr<CudaContext> ctx, uint64_t length);
  ~DeviceAllocation();
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;

  CUdeviceptr ptr() const { return ptr_; }
  uint64_t length() const { return length_; }
  int ordinal() const { return ctx_->ordinal(); }
  const std::shared_ptr<CudaContext>& context() const { return ctx_; }

 private:
  std::shared_ptr<CudaContext> ctx_;
  CUdeviceptr ptr_ = 0;
  uint64_t length_;
};

class PinnedHostAllocation {
 public:
  PinnedHostAllocation(std::shared_ptr<CudaContext> ctx, uint64_t length);
  ~PinnedHostAllocation();
  PinnedHostAllocation(const PinnedHostAllocation&) = delete;
  PinnedHostAllocation& operator=(const PinnedHostAllocation&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t length() const { return length_; }

 private:
  std::shared_ptr<CudaContext> ctx_;
  uint8_t* data_ = nullptr;
  uint64_t length_;
};

enum class PointerKind {
  kHost,     // ordinary host memory, unknown to CUDA (or CUDA unavailable)
  kPinned,   // page-locked host memory known to CUDA (cuMemHostAlloc/cuMemHostRegister)
  kDevice,   // device memory (cuMemAlloc, cudaMalloc, CuPy/PyTorch allocations)
  kManaged,  // managed (unified) memory, cuMemAllocManaged
};
const char* pointer_kind_name(PointerKind kind);

struct PointerInfo {
  PointerKind kind = PointerKind::kHost;
  int device = -1;  // the owning device's ordinal (device/managed memory), else -1
};

// What `addr` points at (cuPointerGetAttribute); kHost without CUDA. Never throws.
PointerInfo pointer_info(uint64_t addr);

// The device allocation holding an address: its range (cuMemGetAddressRange) and its identity,
// CU_POINTER_ATTRIBUTE_BUFFER_ID (cuPointerGetAttribute): an id the driver gives each
// allocation and never reuses in the process, so an allocation freed and another made at its
// address show two ids (UCX's cuda_ipc cache checks it so). buffer_id is 0 when the driver
// does not report it.
struct AllocationRange {
  uint64_t base = 0;
  uint64_t size = 0;
  uint64_t buffer_id = 0;
  int device = -1;
};

// The allocation holding device address `addr`. Throws Error(kUnsupported) without CUDA or
// cuMemGetAddressRange, Error(kInvalidArgument) when `addr` is not device memory.
AllocationRange allocation_range(uint64_t addr);

// CU_POINTER_ATTRIBUTE_BUFFER_ID of `addr`, or 0 when the driver does not report it. Never
// throws.
uint64_t buffer_id_of(uint64_t addr);

// Calls Python-free cuMemcpy on the context's thread: a blocking device <-> host copy through a
// private stream (used at publish time, never in the staging pipeline).
void copy_device_to_host(const std::shared_ptr<CudaContext>& ctx, void* dst, uint64_t src,
                         uint64_t length);
void copy_host_to_device(const std::shared_ptr<CudaContext>& ctx, uint64_t dst,
                         const void* src, uint64_t length);

// Sets CU_POINTER_ATTRIBUTE_SYNC_MEMOPS on the allocation holding `addr`: synchronous memory
// operations on it then complete before they return, as memory a NIC reads and writes needs
// (CUDA GPUDirect RDMA guide, "Synchronization and Memory Ordering"). Throws Error(kRegistration)
// when the driver lacks cuPointerSetAttribute or refuses.
void set_sync_memops(const std::shared_ptr<CudaContext>& ctx, uint64_t addr);

class DmabufFd {
 public:
  // Throws Error(kUnsupported) when the driver lacks cuMemGetHandleForAddressRange (CUDA <
  // 11.7) or refuses (proprietary kernel modules: the message says to use the open ones).
  DmabufFd(const std::shared_ptr<CudaContext>& ctx, uint64_t addr, uint64_t length);
  int fd() const { return fd_.get(); }
  uint64_t offset() const { return offset_; }  // addr - the page-aligned start exported

 private:
  UniqueFd fd_;
  uint64_t offset_ = 0;
};

}  // namespace rdmaxfer
