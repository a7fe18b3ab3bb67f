// GPU memory between processes of one host (issue 14 item 3): CUDA IPC on the shm transport.
//
// Device memory registered on an shm engine is an IpcDeviceRegion: at registration its
// allocation is exported once with cuIpcGetMemHandle (cuMemAlloc'd memory: CuPy, PyTorch and
// rdmaxfer's own device buffers allocate so), or, for memory of the VMM API (cuMemCreate +
// cuMemMap: PyTorch's expandable segments), which has no IPC handle, with
// cuMemRetainAllocationHandle + cuMemExportToShareableHandle as a POSIX fd; it fails here, not
// later, for memory neither can share. A VMM allocation's fd goes to each peer once, over the
// connection's UNIX socket (SCM_RIGHTS) before the first record that names it; the peer
// imports it (cuMemImportFromShareableHandle), maps it at an address of its own
// (cuMemAddressReserve, cuMemMap) with read-write access for its GPU (cuMemSetAccess), and
// unmaps and releases it when the connection ends. A WRITE, READ or message whose local memory is such a region carries the
// handle and the range's offset in the allocation; the side that owns the target memory checks
// the access against its RegionTable as for host memory, opens the peer's allocation once
// (IpcPeerMemory: one cuIpcOpenMemHandle per allocation, cached per connection, closed when
// the connection ends: closed, aborted or the peer died) and copies on a stream
// (cuMemcpyDtoDAsync between GPUs, peer access enabled lazily by the driver; DtoH/HtoD when
// its own memory is host memory), synchronizing before it acknowledges.
//
// Host memory of the initiator into device memory of the target (or back) is staged through a
// host bounce buffer at the target (cma_device_copy): the CPU cannot reach the device memory
// of another process, and CMA cannot reach device memory.
//
// A record also carries the allocation's identity, CU_POINTER_ATTRIBUTE_BUFFER_ID (0 when the
// driver does not report it), so the peer never serves a record from a mapping of memory that
// was freed and replaced: it keys what it opened by the handle and that id, and when a record
// names another allocation at an address it holds a mapping for (the old one was freed and a
// new one took its place), it closes the old mapping first. Mappings by IPC handle are bounded
// (kMaxIpcMappings per connection, the least recently used closed first; opened again from
// the handle when named again); VMM imports stay until the connection ends (their fd comes
// once).
//
// What a peer is given: the handle maps the whole allocation in the opener; the engine checks
// every access against the registered range, as for host memory. Both processes run as one
// user (the shm transport requires it, for CMA), so the handle gives the peer nothing that
// ptrace would not.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/unique_fd.h"
#include "core/region.h"
#include "cuda/cuda_api.h"
#include "cuda/cuda_context.h"
#include "cuda/cuda_stream.h"
#include "transport/shm/cma_copy.h"

namespace rdmaxfer {

// Device memory registered on the shm transport, exported for CUDA IPC.
class IpcDeviceRegion : public MemoryRegion {
 public:
  // Throws Error(kUnsupported) when the driver lacks CUDA IPC, Error(kRegistration) when the
  // memory cannot be exported (neither cuMemAlloc'd nor VMM device memory exportable as a
  // POSIX fd).
  IpcDeviceRegion(uint8_t* addr, uint64_t length, uint32_t access);

  const std::shared_ptr<CudaContext>& context() const { return ctx_; }
  bool cpu_addressable() const override { return false; }
  // What a record names [addr, addr+length) of this region by: the allocation's handle
  // (kIpcHandleSize bytes), its buffer id and the offset of `addr` in the allocation (8 bytes
  // each); for VMM memory its id, the mapped range's size, the buffer id and the offset (8
  // bytes each).
  std::string wire_name(const uint8_t* addr) const;
  // VMM memory: the exported POSIX fd (passed to each peer once) and the id records name it
  // by (unique in this process); -1 and 0 for cuMemAlloc'd memory.
  int vmm_fd() const { return vmm_fd_.get(); }
  uint64_t vmm_id() const { return vmm_id_; }
  // The allocation's CU_POINTER_ATTRIBUTE_BUFFER_ID at registration (0: not reported).
  uint64_t buffer_id() const { return buffer_id_; }

 private:
  // Exports the VMM allocation mapped at `base` (`size` bytes); false when the memory is not
  // VMM memory or the driver lacks the calls. Throws Error(kRegistration) when the export fails.
  bool export_vmm(const CudaApi& api, uint64_t base, uint64_t size);

  std::shared_ptr<CudaContext> ctx_;
  std::string handle_;     // the CUipcMemHandle's bytes (cuMemAlloc'd memory)
  uint64_t alloc_base_ = 0;
  uint64_t alloc_size_ = 0;
  uint64_t buffer_id_ = 0;
  UniqueFd vmm_fd_;
  uint64_t vmm_id_ = 0;
};

// The IpcDeviceRegion `region` is, or nullptr for host memory.
const IpcDeviceRegion* ipc_device_region(const MemoryRegion* region);

// Mappings by IPC handle one connection keeps open at most.
constexpr size_t kMaxIpcMappings = 128;

// The peer's allocations this end opened, and its copy stream (one per connection).
class IpcPeerMemory {
 public:
  // `same_process`: both ends are engines of this process (the driver refuses to open a
  // process's own handle): the initiator's device addresses are then used as they are.
  explicit IpcPeerMemory(bool same_process);
  ~IpcPeerMemory();
  IpcPeerMemory(const IpcPeerMemory&) = delete;
  IpcPeerMemory& operator=(const IpcPeerMemory&) = delete;

  // The fd of the peer's VMM allocation `id`, as the connection received it (it waits for it,
  // bounded, and throws when it does not come).
  using VmmFdSource = std::function<UniqueFd(uint64_t id)>;

  // Copies `length` bytes between the peer's range named by `wire_name` (at device address
  // `peer_addr` in the peer's process) and `local` (inside `local_region`, host or device
  // memory): into `local` when `to_local`, else out of it. Opens (or imports, with the fd from
  // `vmm_fd`) the peer's allocation on first use, after closing a mapping of another
  // allocation the peer had at the same address (another buffer id: freed since). Throws
  // Error(kProtocol) for a malformed name, Error(kTransport) with the driver's text when a
  // CUDA call fails.
  void copy(const std::string& wire_name, uint64_t peer_addr, const MemoryRegion& local_region,
            uint8_t* local, uint64_t length, bool to_local, const VmmFdSource& vmm_fd);
  // Allocations opened now.
  uint64_t opened() const;
  // Mappings closed because the peer named another allocation at their address, or beyond
  // the bound on mappings by IPC handle.
  uint64_t closed_stale() const;
  // Closes every opened allocation (the connection ended).
  void close_all();

 private:
  class Mapping;
  // Closes the mappings of allocations the peer had at `peer_base` other than `buffer_id`, and
  // beyond kMaxIpcMappings the least recently used mapping by IPC handle. Caller holds mu_.
  void close_stale_locked(uint64_t peer_base, uint64_t buffer_id);

  const bool same_process_;
  mutable std::mutex mu_;
  // By handle bytes and buffer id, or "V" and the VMM id.
  std::map<std::string, std::unique_ptr<Mapping>> open_;
  uint64_t uses_ = 0;          // copies made (a mapping notes the last it served)
  uint64_t closed_stale_ = 0;  // see closed_stale()
  std::map<int, std::unique_ptr<CudaStream>> streams_;    // by local GPU ordinal
};

// A copy between `local` device memory of `region` and host memory of process `pid` (CMA),
// through a host bounce buffer: pulled from the peer then up when `direction` is kPull, down
// then pushed when kPush. Returns 0 or the errno of the failed CMA call; throws Error on a
// failed CUDA copy.
int cma_device_copy(pid_t pid, CmaDirection direction, const IpcDeviceRegion& region,
                    uint8_t* local, uint64_t remote, uint64_t length);

}  // namespace rdmaxfer
