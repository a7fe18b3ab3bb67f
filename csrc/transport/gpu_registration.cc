#include "transport/gpu_registration.h"

#include "common/error.h"
#include "cuda/cuda_memory.h"
#include "transport/transport.h"

namespace rdmaxfer {

std::shared_ptr<MemoryRegion> register_gpu_memory(Transport& transport, uint64_t addr,
                                                  uint64_t length, uint32_t access,
                                                  const std::string& method, int ordinal) {
  if (method != "peermem" && method != "dmabuf" && method != "cuda_ipc") {
    throw Error(ErrorKind::kInvalidArgument, "GPU registration method '" + method +
                                                 "' must be 'dmabuf', 'peermem' or 'cuda_ipc'");
  }
  uint8_t* ptr = reinterpret_cast<uint8_t*>(addr);
  if (method == "cuda_ipc") {
    // A same-host transport exports the allocation for CUDA IPC; as an automatic engine's
    // companion, into its owner's domain.
    if (!transport.capabilities().device_ipc) {
      throw Error(ErrorKind::kUnsupported,
                  "GPU registration by CUDA IPC needs an engine with transport='shm' or "
                  "transport='auto' (over TCP, with same-host peers on shm)");
    }
    return transport.domain().register_device_memory(ptr, length, access, -1, 0, &transport);
  }
  if (!transport.capabilities().gpu_direct) {
    // No NIC: refuse before touching the memory (the transport refuses device regions).
    return transport.domain().register_device_memory(ptr, length, access, -1, 0);
  }
  const std::shared_ptr<CudaContext> ctx = CudaContext::get(ordinal);
  // The NIC will access this range behind the GPU's back (cuda/cuda_memory.h).
  set_sync_memops(ctx, addr);
  if (method == "peermem") {
    return transport.domain().register_device_memory(ptr, length, access, -1, 0);
  }
  // Exported page-aligned; the MR starts `offset` bytes into the dmabuf (cuda_memory.h). The
  // MR holds its own reference to the dmabuf; our fd is closed on return.
  DmabufFd fd(ctx, addr, length);
  return transport.domain().register_device_memory(ptr, length, access, fd.fd(), fd.offset());
}

}  // namespace rdmaxfer
