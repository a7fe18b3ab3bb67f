#include "cuda/cuda_memory.h"

#include <unistd.h>

#include "common/error.h"
#include "cuda/cuda_api.h"
#include "cuda/cuda_stream.h"

namespace rdmaxfer {

namespace {
constexpr CUresult kCudaErrorOutOfMemory = 2;  // CUDA_ERROR_OUT_OF_MEMORY
}

DeviceAllocation::DeviceAllocation(std::shared_ptr<CudaContext> ctx, uint64_t length)
    : ctx_(std::move(ctx)), length_(length) {
  ctx_->bind();
  // cuMemAlloc refuses 0 bytes; an empty array still gets a valid (1-byte) address.
  const CUresult r = cuda().mem_alloc(&ptr_, length == 0 ? 1 : length);
  if (r == kCudaErrorOutOfMemory) {
    throw Error(ErrorKind::kRegistration,
                cuda_error_text("cuMemAlloc of " + std::to_string(length) + " bytes on cuda:" +
                                    std::to_string(ctx_->ordinal()),
                                r) +
                    "; free GPU memory or allocate less");
  }
  check_cuda(r, "cuMemAlloc of " + std::to_string(length) + " bytes");
}

DeviceAllocation::~DeviceAllocation() {
  if (ptr_ == 0) return;
  try {
    ctx_->bind();
  } catch (const Error&) {
  }
  cuda().mem_free(ptr_);
}

PinnedHostAllocation::PinnedHostAllocation(std::shared_ptr<CudaContext> ctx, uint64_t length)
    : ctx_(std::move(ctx)), length_(length) {
  ctx_->bind();
  void* p = nullptr;
  const CUresult r = cuda().mem_host_alloc(&p, length == 0 ? 1 : length, kMemHostAllocPortable);
  if (r != kCudaSuccess) {
    throw Error(ErrorKind::kRegistration,
                cuda_error_text("cuMemHostAlloc of " + std::to_string(length) + " bytes", r) +
                    "; page-locked host memory is short: lower the staging chunk size or "
                    "free host memory");
  }
  data_ = static_cast<uint8_t*>(p);
}

PinnedHostAllocation::~PinnedHostAllocation() {
  if (data_ != nullptr) cuda().mem_free_host(data_);
}

const char* pointer_kind_name(PointerKind kind) {
  switch (kind) {
    case PointerKind::kHost: return "host";
    case PointerKind::kPinned: return "pinned";
    case PointerKind::kDevice: return "device";
    case PointerKind::kManaged: return "managed";
  }
  return "unknown";
}

PointerInfo pointer_info(uint64_t addr) {
  PointerInfo info;
  const CudaApi* api = cuda_api(nullptr);
  if (api == nullptr || addr == 0) return info;
  unsigned type = 0;
  if (api->pointer_get_attribute(&type, kPointerAttrMemoryType, addr) != kCudaSuccess) {
    return info;  // CUDA_ERROR_INVALID_VALUE: memory CUDA does not know: plain host memory
  }
  unsigned managed = 0;
  api->pointer_get_attribute(&managed, kPointerAttrIsManaged, addr);
  int ordinal = -1;
  if (type == kMemoryTypeDevice || managed != 0) {
    api->pointer_get_attribute(&ordinal, kPointerAttrDeviceOrdinal, addr);
  }
  if (managed != 0) {
    info.kind = PointerKind::kManaged;
  } else if (type == kMemoryTypeDevice || type == kMemoryTypeArray) {
    info.kind = PointerKind::kDevice;
  } else if (type == kMemoryTypeHost) {
    info.kind = PointerKind::kPinned;
  }
  info.device = ordinal;
  return info;
}

uint64_t buffer_id_of(uint64_t addr) {
  const CudaApi* api = cuda_api(nullptr);
  unsigned long long id = 0;
  if (api == nullptr) return 0;
  if (api->pointer_get_attribute(&id, kPointerAttrBufferId, addr) != kCudaSuccess) return 0;
  return static_cast<uint64_t>(id);
}

AllocationRange allocation_range(uint64_t addr) {
  const CudaApi& api = cuda();
  if (api.mem_get_address_range == nullptr) {
    throw Error(ErrorKind::kUnsupported, "this NVIDIA driver lacks cuMemGetAddressRange_v2");
  }
  const PointerInfo info = pointer_info(addr);
  if (info.kind != PointerKind::kDevice) {
    throw Error(ErrorKind::kInvalidArgument, std::string("address ") + std::to_string(addr) +
                                                 " is " + pointer_kind_name(info.kind) +
                                                 " memory, not device memory");
  }
  CudaContext::get(info.device)->bind();
  CUdeviceptr base = 0;
  size_t size = 0;
  check_cuda(api.mem_get_address_range(&base, &size, addr), "cuMemGetAddressRange");
  AllocationRange range;
  range.base = base;
  range.size = size;
  range.buffer_id = buffer_id_of(base);
  range.device = info.device;
  return range;
}

void copy_device_to_host(const std::shared_ptr<CudaContext>& ctx, void* dst, uint64_t src,
                         uint64_t length) {
  if (length == 0) return;
  ctx->bind();
  CudaStream stream(ctx);
  check_cuda(cuda().memcpy_dtoh_async(dst, src, length, stream.get()), "cuMemcpyDtoHAsync");
  stream.synchronize();
}

void copy_host_to_device(const std::shared_ptr<CudaContext>& ctx, uint64_t dst,
                         const void* src, uint64_t length) {
  if (length == 0) return;
  ctx->bind();
  CudaStream stream(ctx);
  check_cuda(cuda().memcpy_htod_async(dst, src, length, stream.get()), "cuMemcpyHtoDAsync");
  stream.synchronize();
}

void set_sync_memops(const std::shared_ptr<CudaContext>& ctx, uint64_t addr) {
  const CudaApi& api = cuda();
  if (api.pointer_set_attribute == nullptr) {
    throw Error(ErrorKind::kRegistration,
                "this NVIDIA driver lacks cuPointerSetAttribute, needed to set SYNC_MEMOPS on "
                "GPU memory the NIC accesses; upgrade the driver");
  }
  ctx->bind();
  const unsigned on = 1;
  const CUresult r = api.pointer_set_attribute(&on, kPointerAttrSyncMemops, addr);
  if (r != kCudaSuccess) {
    throw Error(ErrorKind::kRegistration,
                cuda_error_text("cuPointerSetAttribute(SYNC_MEMOPS)", r) +
                    "; the address must be device memory from cuMemAlloc (or an allocator "
                    "built on it)");
  }
}

DmabufFd::DmabufFd(const std::shared_ptr<CudaContext>& ctx, uint64_t addr, uint64_t length) {
  const CudaApi& api = cuda();
  if (api.mem_get_handle_for_address_range == nullptr) {
    throw Error(ErrorKind::kUnsupported,
                "dmabuf: this NVIDIA driver lacks cuMemGetHandleForAddressRange (CUDA 11.7+ "
                "drivers have it); upgrade the driver");
  }
  ctx->bind();
  // The range must be aligned to the host page size; register the aligned range's dmabuf and
  // address the array at `offset` inside it.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t begin = addr / page * page;
  const uint64_t end = (addr + (length == 0 ? 1 : length) + page - 1) / page * page;
  int fd = -1;
  const CUresult r = api.mem_get_handle_for_address_range(&fd, begin, end - begin,
                                                          kMemRangeHandleTypeDmaBufFd, 0);
  if (r != kCudaSuccess) {
    throw Error(ErrorKind::kUnsupported,
                cuda_error_text("cuMemGetHandleForAddressRange(DMA_BUF_FD)", r) +
                    "; dmabuf export needs the open NVIDIA kernel modules (nvidia-open) and "
                    "a GPU that reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED");
  }
  fd_.reset(fd);
  offset_ = addr - begin;
}

}  // namespace rdmaxfer
