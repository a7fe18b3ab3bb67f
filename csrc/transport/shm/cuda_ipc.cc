#include "transport/shm/cuda_ipc.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "cuda/cuda_api.h"
#include "cuda/cuda_memory.h"

namespace rdmaxfer {

namespace {

constexpr size_t kWireNameSize = kIpcHandleSize + sizeof(uint64_t);
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
  CUipcMemHandle handle{};
  const CUresult r = api.ipc_get_mem_handle(&handle, base);
  if (r != kCudaSuccess) {
    throw Error(ErrorKind::kRegistration,
                cuda_error_text("cuIpcGetMemHandle", r) +
                    "; CUDA IPC shares cuMemAlloc'd memory (not cuMemCreate/VMM or managed "
                    "memory); use transport='tcp' for such memory");
  }
  handle_.assign(handle.reserved, kIpcHandleSize);
  alloc_base_ = base;
}

std::string IpcDeviceRegion::wire_name(const uint8_t* addr) const {
  const uint64_t offset = reinterpret_cast<uint64_t>(addr) - alloc_base_;
  std::string name = handle_;
  name.append(reinterpret_cast<const char*>(&offset), sizeof(offset));
  return name;
}

const IpcDeviceRegion* ipc_device_region(const MemoryRegion* region) {
  return dynamic_cast<const IpcDeviceRegion*>(region);
}

// One opened peer allocation; closed (cuIpcCloseMemHandle) on destruction.
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
  ~Mapping() {
    ctx_->bind();
    cuda().ipc_close_mem_handle(base_);  // nothing to do on failure: the peer may be gone
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  CUdeviceptr base() const { return base_; }

 private:
  std::shared_ptr<CudaContext> ctx_;
  CUdeviceptr base_ = 0;
};

IpcPeerMemory::IpcPeerMemory(bool same_process) : same_process_(same_process) {}
IpcPeerMemory::~IpcPeerMemory() { close_all(); }

uint64_t IpcPeerMemory::opened() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_.size();
}

void IpcPeerMemory::close_all() {
  // Closed under the lock: once opened() says 0, nothing is open.
  std::lock_guard<std::mutex> lock(mu_);
  open_.clear();
  streams_.clear();
}

void IpcPeerMemory::copy(const std::string& wire_name, uint64_t peer_addr,
                         const MemoryRegion& local_region, uint8_t* local, uint64_t length,
                         bool to_local) {
  if (wire_name.size() != kWireNameSize) {
    throw Error(ErrorKind::kProtocol, "shm: a CUDA IPC name of " +
                                          std::to_string(wire_name.size()) + " bytes (expected " +
                                          std::to_string(kWireNameSize) + ")");
  }
  const IpcDeviceRegion* device = ipc_device_region(&local_region);
  const std::shared_ptr<CudaContext> ctx =
      device != nullptr ? device->context() : CudaContext::get(0);
  const std::string handle = wire_name.substr(0, kIpcHandleSize);
  uint64_t offset = 0;
  std::memcpy(&offset, wire_name.data() + kIpcHandleSize, sizeof(offset));
  std::lock_guard<std::mutex> lock(mu_);  // one copy at a time per connection, in record order
  CUdeviceptr peer = peer_addr;
  if (!same_process_) {
    auto it = open_.find(handle);
    if (it == open_.end()) {
      it = open_.emplace(handle, std::make_unique<Mapping>(ctx, handle)).first;
    }
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
