// Registering GPU memory with a transport (GPUDirect RDMA; the methods and their error text are
// in cuda/gpudirect.h), and whether this libibverbs can register dmabuf memory at all.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace rdmaxfer {

class Transport;
class MemoryRegion;

// Registers device memory of GPU `ordinal` with `transport` by `method` ("dmabuf" exports the
// range with cuMemGetHandleForAddressRange first; "peermem" registers the pointer; "cuda_ipc", on
// the shm transport only, exports the allocation for CUDA IPC: transport/shm/cuda_ipc.h). Throws
// Error(kUnsupported) (TCP, no CUDA, no dmabuf support) or Error(kRegistration) with the fix.
std::shared_ptr<MemoryRegion> register_gpu_memory(Transport& transport, uint64_t addr,
                                                  uint64_t length, uint32_t access,
                                                  const std::string& method, int ordinal);

// "" when this libibverbs can register dmabuf memory (ibv_reg_dmabuf_mr), else why not.
std::string verbs_dmabuf_unavailable();

}  // namespace rdmaxfer
