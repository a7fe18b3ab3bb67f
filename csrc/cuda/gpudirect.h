// GPUDirect RDMA registration: how a verbs transport registers GPU memory, and what to tell the
// user when it cannot.
//
// Two ways, in order of preference (the preflight in python/rdmaxfer/topology.py decides which
// one to try and says why not the others):
//   dmabuf:  cuMemGetHandleForAddressRange exports the range as a dmabuf fd (cuda_memory.h:
//            DmabufFd); ibv_reg_dmabuf_mr registers it (kernel >= 5.12, rdma-core >= 34, the
//            open NVIDIA kernel modules).
//   peermem: ibv_reg_mr on the device pointer itself; the nvidia-peermem kernel module lets the
//            HCA driver pin GPU pages.
// Anything else (no NIC, rxe/siw, TCP) goes through staging (staging.h).
#pragma once

#include <cstdint>
#include <string>

namespace rdmaxfer {

enum class GpuRegistration { kDmabuf, kPeermem };
const char* gpu_registration_name(GpuRegistration method);

// "ibv_reg_dmabuf_mr of N bytes of GPU memory: Bad address (errno 14); <cause and fix>".
std::string gpu_registration_error(GpuRegistration method, uint64_t length, int err_no);

}  // namespace rdmaxfer

#include <memory>

namespace rdmaxfer {

class Transport;
class MemoryRegion;

// Registers device memory of GPU `ordinal` with `transport` by `method` ("dmabuf" exports the
// range with cuMemGetHandleForAddressRange first; "peermem" registers the pointer). Throws
// Error(kUnsupported) (TCP, no CUDA, no dmabuf support) or Error(kRegistration) with the fix.
std::shared_ptr<MemoryRegion> register_gpu_memory(Transport& transport, uint64_t addr,
                                                  uint64_t length, uint32_t access,
                                                  const std::string& method, int ordinal);

// "" when this libibverbs can register dmabuf memory (ibv_reg_dmabuf_mr), else why not.
std::string verbs_dmabuf_unavailable();

}  // namespace rdmaxfer
