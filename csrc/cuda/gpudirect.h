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
// Anything else (no NIC, rxe/siw, TCP) goes through staging (protocol/staging.h).
#pragma once

#include <cstdint>
#include <string>

namespace rdmaxfer {

enum class GpuRegistration { kDmabuf, kPeermem };
const char* gpu_registration_name(GpuRegistration method);

// "ibv_reg_dmabuf_mr of N bytes of GPU memory: Bad address (errno 14); <cause and fix>".
std::string gpu_registration_error(GpuRegistration method, uint64_t length, int err_no);

}  // namespace rdmaxfer
