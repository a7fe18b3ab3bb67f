// Registering GPU memory with a transport, by what the transport declares it can do
// (Capabilities::gpu_direct: the NIC reads device memory, by the methods and error text of
// cuda/gpudirect.h; Capabilities::device_ipc: exported for same-host peers).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace rdmaxfer {

class Transport;
class MemoryRegion;

// Registers device memory of GPU `ordinal` with `transport` by `method` ("dmabuf" exports the
// range with cuMemGetHandleForAddressRange first; "peermem" registers the pointer; "cuda_ipc",
// on a transport with device_ipc, exports the allocation for CUDA IPC). A transport with
// neither capability refuses (its device memory goes through staging). Throws
// Error(kUnsupported) (no such capability, no CUDA, no dmabuf support) or
// Error(kRegistration) with the fix.
std::shared_ptr<MemoryRegion> register_gpu_memory(Transport& transport, uint64_t addr,
                                                  uint64_t length, uint32_t access,
                                                  const std::string& method, int ordinal);

}  // namespace rdmaxfer
