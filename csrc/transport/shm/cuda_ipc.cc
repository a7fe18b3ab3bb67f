#include "transport/shm/cuda_ipc.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "cuda/cuda_api.h"
#include "cuda/cuda_memory.h"

namespace rdmaxfer {

namespace {

// A cuMemAlloc'd allocation's name: its handle, buffer id and the offset.
constexpr size_t kWireNameSize = kIpcHandleSize + 2 * sizeof(uint64_t);
// A VMM allocation's name: its id, the mapped range's size, buffer id and the offset.
constexpr size_t kVmmNameSize = 4 * sizeof(uint64_t);
// Ids of exported VMM allocations, unique in this process.
std::atomic<uint64_t> g_next_vmm_id{1};

uint64_t load_u64(const std::string& bytes, size_t at) {
  uint64_t v = 0;
  std::memcpy(&v, bytes.data() + at, sizeof(v));
  return v;
}

void append_u64(std::string* out, uint64_t v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}
// The bounce buffer of a copy between host memory of the peer and device memory here.
constexpr uint64_t kBounceBytes = 4ull << 20;

const CudaApi& ipc_api() {
  const CudaApi& api = cuda();
  const std::string why = cuda_ipc_unavailable(api);
  if (!why.empty()) throw Error(ErrorKind::kUnsupported, why + " or use transport='tcp'");
  return api;
}

}  // namespace

IpcDeviceRegion::IpcDeviceRegion(uint8_t* addr, uint64_t length, uint32_t access)
    : MemoryRegion(addr, length, access, nullptr) {
  const CudaApi& api = ipc_api();
  const PointerInfo info = pointer_info(reinterpret_cast<uint64_t>(addr));
  if (info.kind != PointerKind::kDevice) {
    throw Error(ErrorKind::kRegistration,
                std::string("CUDA IPC: the memory is ") + pointer_kind_name(info.kind) +
                    " memory, not device memory from cuMemAlloc; register device memory");
  }
  ctx_ = CudaContext::get(info.device);
  ctx_->bind();
  const auto ptr = reinterpret_cast<CUdeviceptr>(addr);
  CUdeviceptr base = 0;
  size_t size = 0;
  check_cuda(api.mem_get_address_range(&base, &size, ptr), "cuMemGetAddressRange");
  if (ptr + length > base + size) {
    throw Error(ErrorKind::kRegistration,
                "CUDA IPC: " + std::to_string(length) + " bytes at the address run past its "
                "allocation (" + std::to_string(size) + " bytes); register one allocation's range");
  }
  alloc_base_ = base;
  alloc_size_ = size;
  buffer_id_ = buffer_id_of(base);
  CUipcMemHandle handle{};
  const CUresult r = api.ipc_get_mem_handle(&handle, base);
  if (r == kCudaSuccess) {
    handle_.assign(handle.reserved, kIpcHandleSize);
    return;
  }
  if (export_vmm(api, base, size)) return;
  const std::string vmm = cuda_vmm_ipc_unavailable(api);
  throw Error(ErrorKind::kRegistration,
              cuda_error_text("cuIpcGetMemHandle", r) +
                  "; CUDA IPC shares cuMemAlloc'd memory, and cuMemCreate (VMM) memory " +
                  (vmm.empty() ? std::string("through a POSIX fd") : "(but " + vmm + ")") +
                  ", not managed or host memory; use transport='tcp' for such memory");
}

bool IpcDeviceRegion::export_vmm(const CudaApi& api, uint64_t base, uint64_t size) {
  if (!cuda_vmm_ipc_unavailable(api).empty()) return false;
  CUmemGenericAllocationHandle h = 0;
  if (api.mem_retain_allocation_handle(&h, reinterpret_cast<void*>(base)) != kCudaSuccess) {
    return false;  // not memory of the VMM API
  }
  int fd = -1;
  const CUresult r = api.mem_export_to_shareable_handle(&fd, h, kMemHandleTypePosixFd, 0);
  api.mem_release(h);  // the retained reference; the exported fd holds the allocation
  if (r != kCudaSuccess) {
    throw Error(ErrorKind::kRegistration,
                cuda_error_text("cuMemExportToShareableHandle (POSIX fd)", r) +
                    "; CUDA IPC shares VMM memory created with "
                    "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in its requestedHandleTypes");
  }
  vmm_fd_ = UniqueFd(fd);
  vmm_id_ = g_next_vmm_id.fetch_add(1);
  alloc_size_ = size;
  return true;
}

std::string IpcDeviceRegion::wire_name(const uint8_t* addr) const {
  const uint64_t offset = reinterpret_cast<uint64_t>(addr) - alloc_base_;
  std::string name;
  if (vmm_fd_.valid()) {
    append_u64(&name, vmm_id_);
    append_u64(&name, alloc_size_);
  } else {
    name = handle_;
  }
  append_u64(&name, buffer_id_);
  append_u64(&name, offset);
  return name;
}

const IpcDeviceRegion* ipc_device_region(const MemoryRegion* region) {
  return dynamic_cast<const IpcDeviceRegion*>(region);
}

// One opened peer allocation: by its IPC handle (closed with cuIpcCloseMemHandle on
// destruction), or a VMM allocation imported from its fd and mapped here (unmapped, its address
// range freed and its handle released on destruction).
class IpcPeerMemory::Mapping {
 public:
  Mapping(const std::shared_ptr<CudaContext>& ctx, const std::string& handle_bytes)
      : ctx_(ctx) {
    const CudaApi& api = ipc_api();
    CUipcMemHandle handle{};
    std::memcpy(handle.reserved, handle_bytes.data(), kIpcHandleSize);
    ctx_->bind();
    check_cuda(api.ipc_open_mem_handle(&base_, handle, kIpcMemLazyEnablePeerAccess),
               "cuIpcOpenMemHandle (the peer's device memory)");
  }
  Mapping(const std::shared_ptr<CudaContext>& ctx, const UniqueFd& fd, uint64_t size)
      : ctx_(ctx), size_(size) {
    const CudaApi& api = ipc_api();
    const std::string vmm = cuda_vmm_ipc_unavailable(api);
    if (!vmm.empty()) throw Error(ErrorKind::kUnsupported, vmm + " (the peer's VMM memory)");
    ctx_->bind();
    check_cuda(api.mem_import_from_shareable_handle(
                   &handle_, reinterpret_cast<void*>(static_cast<intptr_t>(fd.get())),
                   kMemHandleTypePosixFd),
               "cuMemImportFromShareableHandle (the peer's VMM memory)");
    imported_ = true;
    try {
      check_cuda(api.mem_address_reserve(&reserved_, size_, 0, 0, 0), "cuMemAddressReserve");
      check_cuda(api.mem_map(reserved_, size_, 0, handle_, 0), "cuMemMap");
      base_ = reserved_;
      CUmemAccessDesc access{};
      access.location.type = kMemLocationTypeDevice;
      access.location.id = ctx_->ordinal();
      access.flags = kMemAccessReadWrite;
      check_cuda(api.mem_set_access(base_, size_, &access, 1), "cuMemSetAccess");
    } catch (...) {
      release();
      throw;
    }
  }
  ~Mapping() { release(); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  CUdeviceptr base() const { return base_; }

  // Where the peer has the allocation, its buffer id, and the copy it last served.
  uint64_t peer_base = 0;
  uint64_t buffer_id = 0;
  uint64_t last_use = 0;
  bool vmm() const { return imported_; }

 private:
  // Nothing to do on a failed call here: the peer may be gone.
  void release() {
    ctx_->bind();
    const CudaApi& api = cuda();
    if (!imported_) {
      if (base_ != 0) api.ipc_close_mem_handle(base_);
      return;
    }
    if (base_ != 0) api.mem_unmap(base_, size_);
    if (reserved_ != 0) api.mem_address_free(reserved_, size_);
    api.mem_release(handle_);
    base_ = reserved_ = 0;
    imported_ = false;
  }

  std::shared_ptr<CudaContext> ctx_;
  CUdeviceptr base_ = 0;
  // VMM memory: the imported handle and the address range reserved for it.
  bool imported_ = false;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr reserved_ = 0;
  uint64_t size_ = 0;
};

IpcPeerMemory::IpcPeerMemory(bool same_process) : same_process_(same_process) {}
IpcPeerMemory::~IpcPeerMemory() { close_all(); }

uint64_t IpcPeerMemory::opened() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_.size();
}

uint64_t IpcPeerMemory::closed_stale() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_stale_;
}

void IpcPeerMemory::close_stale_locked(uint64_t peer_base, uint64_t buffer_id) {
  size_t by_handle = 0;
  auto oldest = open_.end();
  for (auto it = open_.begin(); it != open_.end();) {
    const Mapping& m = *it->second;
    // Two live allocations never share a base: another id there means the old one was freed.
    if (buffer_id != 0 && m.buffer_id != 0 && m.peer_base == peer_base &&
        m.buffer_id != buffer_id) {
      it = open_.erase(it);
      ++closed_stale_;
      continue;
    }
    if (!m.vmm()) {
      ++by_handle;
      if (oldest == open_.end() || m.last_use < oldest->second->last_use) oldest = it;
    }
    ++it;
  }
  if (by_handle >= kMaxIpcMappings && oldest != open_.end()) {
    open_.erase(oldest);
    ++closed_stale_;
  }
}

void IpcPeerMemory::close_all() {
  // Closed under the lock: once opened() says 0, nothing is open.
  std::lock_guard<std::mutex> lock(mu_);
  open_.clear();
  streams_.clear();
}

void IpcPeerMemory::copy(const std::string& wire_name, uint64_t peer_addr,
                         const MemoryRegion& local_region, uint8_t* local, uint64_t length,
                         bool to_local, const VmmFdSource& vmm_fd) {
  const bool vmm = wire_name.size() == kVmmNameSize;
  if (!vmm && wire_name.size() != kWireNameSize) {
    throw Error(ErrorKind::kProtocol, "shm: a CUDA IPC name of " +
                                          std::to_string(wire_name.size()) + " bytes (expected " +
                                          std::to_string(kWireNameSize) + " or " +
                                          std::to_string(kVmmNameSize) + ")");
  }
  const IpcDeviceRegion* device = ipc_device_region(&local_region);
  const std::shared_ptr<CudaContext> ctx =
      device != nullptr ? device->context() : CudaContext::get(0);
  // The key of the allocation (its IPC handle and buffer id, or "V" and its VMM id), its
  // buffer id and the range's offset.
  const std::string key = vmm ? "V" + wire_name.substr(0, sizeof(uint64_t))
                              : wire_name.substr(0, kIpcHandleSize + sizeof(uint64_t));
  const uint64_t buffer_id = load_u64(wire_name, wire_name.size() - 2 * sizeof(uint64_t));
  const uint64_t offset = load_u64(wire_name, wire_name.size() - sizeof(uint64_t));
  if (offset > peer_addr) {
    throw Error(ErrorKind::kProtocol, "shm: a CUDA IPC name's offset exceeds its address");
  }
  const uint64_t peer_base = peer_addr - offset;
  std::lock_guard<std::mutex> lock(mu_);  // one copy at a time per connection, in record order
  CUdeviceptr peer = peer_addr;
  if (!same_process_) {
    auto it = open_.find(key);
    if (it == open_.end()) {
      close_stale_locked(peer_base, buffer_id);
      std::unique_ptr<Mapping> mapping =
          vmm ? std::make_unique<Mapping>(ctx, vmm_fd(load_u64(wire_name, 0)),
                                          load_u64(wire_name, sizeof(uint64_t)))
              : std::make_unique<Mapping>(ctx, wire_name.substr(0, kIpcHandleSize));
      mapping->peer_base = peer_base;
      mapping->buffer_id = buffer_id;
      it = open_.emplace(key, std::move(mapping)).first;
    }
    it->second->last_use = ++uses_;
    peer = it->second->base() + offset;
  }
  auto& stream = streams_[ctx->ordinal()];
  if (!stream) stream = std::make_unique<CudaStream>(ctx);
  const CudaApi& api = cuda();
  ctx->bind();
  CUresult r = kCudaSuccess;
  const char* op = nullptr;
  if (device != nullptr) {
    const auto mine = reinterpret_cast<CUdeviceptr>(local);
    op = "cuMemcpyDtoDAsync (between this process and the peer)";
    r = to_local ? api.memcpy_dtod_async(mine, peer, length, stream->get())
                 : api.memcpy_dtod_async(peer, mine, length, stream->get());
  } else if (to_local) {
    op = "cuMemcpyDtoHAsync (from the peer's device memory)";
    r = api.memcpy_dtoh_async(local, peer, length, stream->get());
  } else {
    op = "cuMemcpyHtoDAsync (into the peer's device memory)";
    r = api.memcpy_htod_async(peer, local, length, stream->get());
  }
  check_cuda(r, op);
  stream->synchronize();
}

int cma_device_copy(pid_t pid, CmaDirection direction, const IpcDeviceRegion& region,
                    uint8_t* local, uint64_t remote, uint64_t length) {
  std::vector<uint8_t> bounce(static_cast<size_t>(std::min(length, kBounceBytes)));
  for (uint64_t done = 0; done < length;) {
    const uint64_t n = std::min<uint64_t>(bounce.size(), length - done);
    const uint64_t device = reinterpret_cast<uint64_t>(local + done);
    if (direction == CmaDirection::kPull) {
      const int err = cma_copy(pid, direction, bounce.data(), remote + done, n);
      if (err != 0) return err;
      copy_host_to_device(region.context(), device, bounce.data(), n);
    } else {
      copy_device_to_host(region.context(), bounce.data(), device, n);
      const int err = cma_copy(pid, direction, bounce.data(), remote + done, n);
      if (err != 0) return err;
    }
    done += n;
  }
  return 0;
}

}  // namespace rdmaxfer
