// A stand-in for the CUDA driver (libcuda.so.1) over host memory, built only for the tests.
//
// rdmaxfer loads the driver at run time (csrc/cuda/cuda_api.cc); the tests point
// RDMAXFER_CUDA_LIBRARY at this library instead, so every GPU code path (device buffers, CAI
// and DLPack export, staging through pinned bounce buffers, device-to-device sends, weights
// pulled into device memory) runs on machines without a GPU. It never ships in the wheel.
//
// What it keeps honest:
// - Device memory is not host memory. cuMemAlloc maps one memfd twice: the address handed out
//   is PROT_NONE, so a CPU load or store through a device pointer faults as it would on a real
//   GPU (and ibv_reg_mr of it fails, as without nvidia-peermem); the copies go through a
//   second, private read-write mapping of the same pages.
// - Copies are asynchronous. Each stream is a worker thread that runs its copies in order;
//   cuEventQuery answers CUDA_ERROR_NOT_READY until the work recorded before the event ran, so
//   a missing synchronization shows up as wrong data. RDMAXFER_CUDA_STANDIN_DELAY_US delays
//   every copy by that many microseconds to widen such races.
// - Arguments are checked as the driver checks them: a copy that runs past a device
//   allocation, or an unknown pointer, stream or event, fails with CUDA_ERROR_INVALID_VALUE.
// - cuMemGetHandleForAddressRange fails with CUDA_ERROR_NOT_SUPPORTED, as on a driver without
//   dmabuf (RDMAXFER_CUDA_STANDIN_DMABUF=1 lets it export page-aligned ranges, recorded for the
//   tests); the device attributes say neither dmabuf nor GPUDirect RDMA is supported (but see
//   RDMAXFER_CUDA_STANDIN_PEERMEM below).
// - cuPointerSetAttribute(SYNC_MEMOPS) is recorded per allocation and read back by
//   cuPointerGetAttribute, so a test can see it was set.
// - Each device allocation (cuMemAlloc, an opened IPC handle, a cuMemMap'd range) gets a
//   fresh CU_POINTER_ATTRIBUTE_BUFFER_ID, never reused, so an allocation freed and another
//   made at its address differ; RDMAXFER_CUDA_STANDIN_NO_BUFFER_ID=1 (read at each query)
//   answers CUDA_ERROR_INVALID_VALUE for it, as a driver that does not report it.
// - RDMAXFER_CUDA_STANDIN_PEERMEM=1 (read at each cuMemAlloc) pretends nvidia-peermem: the
//   allocation's device address is mapped read-write, so a NIC (rxe, whose CPU copies reach
//   any mapped page) can register and access it as peermem lets a real NIC reach GPU memory,
//   and the device reports CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED. The CPU could then
//   touch such memory too: only the GPUDirect tests use it.
//
// - CUDA IPC (cuda_standin_ipc.cc) shares the memfd behind an allocation with another process
//   on the host, so two-process tests move real bytes between two address spaces.
// - The VMM API (cuda_standin_vmm.cc: cuMemCreate, cuMemAddressReserve, cuMemMap...) keeps each
//   physical allocation in a memfd; cuMemExportToShareableHandle hands out a duplicate of it
//   (a POSIX fd), which another process imports after receiving it over a UNIX socket.
//
// The entry points and values are those of the CUDA Driver API reference
// (docs.nvidia.com/cuda/cuda-driver-api); only the subset csrc/cuda loads is implemented.
#include "standin_core.h"

using namespace standin;  // NOLINT: the driver's own types and state


extern "C" {

CUresult cuInit(unsigned flags) {
  if (flags != 0) return kInvalidValue;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const char* gpus = std::getenv("RDMAXFER_CUDA_STANDIN_GPUS");
  s.devices = gpus != nullptr && *gpus != '\0' ? std::atoi(gpus) : 1;
  if (s.devices < 0 || s.devices > 8) s.devices = 1;
  const char* delay = std::getenv("RDMAXFER_CUDA_STANDIN_DELAY_US");
  s.delay_us = delay != nullptr ? std::atol(delay) : 0;
  s.initialized = true;
  return s.devices == 0 ? 100 /* CUDA_ERROR_NO_DEVICE */ : kSuccess;
}

CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return kInvalidValue;
  *version = 12080;  // reports itself as a CUDA 12.8 driver
  return kSuccess;
}

CUresult cuDeviceGetCount(int* count) {
  if (count == nullptr) return kInvalidValue;
  if (!state().initialized) return kNotInitialized;
  *count = state().devices;
  return kSuccess;
}

// Every pair of distinct GPUs can access each other, unless RDMAXFER_CUDA_STANDIN_NO_PEER is
// set (GPUs on two PCIe root complexes, as a test wants them).
CUresult cuDeviceCanAccessPeer(int* can, CUdevice device, CUdevice peer) {
  if (can == nullptr) return kInvalidValue;
  if (!state().initialized) return kNotInitialized;
  if (device < 0 || device >= state().devices || peer < 0 || peer >= state().devices) {
    return kInvalidDevice;
  }
  const char* off = std::getenv("RDMAXFER_CUDA_STANDIN_NO_PEER");
  *can = device != peer && (off == nullptr || *off == '\0') ? 1 : 0;
  return kSuccess;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (device == nullptr) return kInvalidValue;
  if (ordinal < 0 || ordinal >= state().devices) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice device) {
  if (name == nullptr || len <= 0) return kInvalidValue;
  if (device < 0 || device >= state().devices) return kInvalidDevice;
  std::snprintf(name, static_cast<size_t>(len), "rdmaxfer CUDA stand-in (host memory)");
  return kSuccess;
}

CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
  if (value == nullptr) return kInvalidValue;
  if (device < 0 || device >= state().devices) return kInvalidDevice;
  switch (attribute) {
    case 33: *value = 0x40 + device; break;  // PCI_BUS_ID: 0000:4X:00.0, absent from sysfs
    case 34: *value = 0; break;              // PCI_DEVICE_ID
    case 41: *value = 1; break;              // UNIFIED_ADDRESSING
    case 50: *value = 0; break;              // PCI_DOMAIN_ID
    case 75: *value = 9; break;              // COMPUTE_CAPABILITY_MAJOR
    case 76: *value = 0; break;              // COMPUTE_CAPABILITY_MINOR
    case 116: *value = peermem() ? 1 : 0; break;  // GPU_DIRECT_RDMA_SUPPORTED
    case 124: *value = 0; break;             // DMA_BUF_SUPPORTED
    default: *value = 0; break;
  }
  return kSuccess;
}

CUresult cuDeviceGetPCIBusId(char* bus_id, int len, CUdevice device) {
  if (bus_id == nullptr || len <= 0) return kInvalidValue;
  if (device < 0 || device >= state().devices) return kInvalidDevice;
  std::snprintf(bus_id, static_cast<size_t>(len), "0000:%02X:00.0", 0x40 + device);
  return kSuccess;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
  if (bytes == nullptr) return kInvalidValue;
  if (device < 0 || device >= state().devices) return kInvalidDevice;
  *bytes = kTotalMemory;
  return kSuccess;
}

CUresult cuDevicePrimaryCtxRetain(void** context, CUdevice device) {
  if (context == nullptr) return kInvalidValue;
  if (device < 0 || device >= state().devices) return kInvalidDevice;
  *context = &state().contexts[device];
  return kSuccess;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  return device < 0 || device >= state().devices ? kInvalidDevice : kSuccess;
}

CUresult cuCtxSetCurrent(void* context) {
  if (context == nullptr) return kSuccess;
  int* contexts = state().contexts;
  const auto* c = static_cast<int*>(context);
  if (c < contexts || c >= contexts + state().devices) return kInvalidValue;
  current_device = static_cast<int>(c - contexts);
  return kSuccess;
}

CUresult cuMemAlloc_v2(CUdeviceptr* out, size_t size) {
  if (out == nullptr || size == 0) return kInvalidValue;
  const size_t page = page_size();
  const size_t mapped = (size + page - 1) / page * page;
  const int fd = memfd_create("rdmaxfer-cuda-standin", MFD_CLOEXEC);
  if (fd < 0) return kOutOfMemory;
  if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    close(fd);
    return kOutOfMemory;
  }
  const int device_prot = peermem() ? PROT_READ | PROT_WRITE : PROT_NONE;
  void* device = mmap(nullptr, mapped, device_prot, MAP_SHARED, fd, 0);
  void* shadow = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (device == MAP_FAILED || shadow == MAP_FAILED) {
    if (device != MAP_FAILED) munmap(device, mapped);
    if (shadow != MAP_FAILED) munmap(shadow, mapped);
    close(fd);
    return kOutOfMemory;
  }
  DeviceAllocation a;
  a.fd = fd;
  a.shadow = static_cast<uint8_t*>(shadow);
  a.mapped = mapped;
  a.size = size;
  a.device = current_device;
  std::lock_guard<std::mutex> lock(state().mu);
  add_device(reinterpret_cast<uintptr_t>(device), a);
  *out = reinterpret_cast<uintptr_t>(device);
  return kSuccess;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) {
  DeviceAllocation a;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    auto it = state().device_allocations.find(static_cast<uintptr_t>(ptr));
    // Memory opened from another process is closed with cuIpcCloseMemHandle, not freed.
    if (it == state().device_allocations.end() || it->second.imported || it->second.vmm != 0) {
      return kInvalidValue;  // cuMemMap'd memory is unmapped with cuMemUnmap
    }
    a = it->second;
    state().device_allocations.erase(it);
  }
  munmap(reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)), a.mapped);
  munmap(a.shadow, a.mapped);
  close(a.fd);
  return kSuccess;
}

CUresult cuMemHostAlloc(void** out, size_t size, unsigned /*flags*/) {
  if (out == nullptr || size == 0) return kInvalidValue;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return kOutOfMemory;
  std::lock_guard<std::mutex> lock(state().mu);
  state().host_allocations.insert(reinterpret_cast<uintptr_t>(p));
  state().host_sizes[reinterpret_cast<uintptr_t>(p)] = size;
  *out = p;
  return kSuccess;
}

CUresult cuMemFreeHost(void* p) {
  size_t size = 0;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    const auto key = reinterpret_cast<uintptr_t>(p);
    if (state().host_allocations.erase(key) == 0) return kInvalidValue;
    size = state().host_sizes[key];
    state().host_sizes.erase(key);
  }
  munmap(p, size);
  return kSuccess;
}

CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* stream) {
  if (dst == nullptr) return kInvalidValue;
  if (n == 0) return kSuccess;
  uint8_t* from = shadow_of(src, n);
  if (from == nullptr) return kInvalidValue;
  return enqueue_copy(dst, from, n, stream);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* stream) {
  if (src == nullptr) return kInvalidValue;
  if (n == 0) return kSuccess;
  uint8_t* to = shadow_of(dst, n);
  if (to == nullptr) return kInvalidValue;
  return enqueue_copy(to, src, n, stream);
}

CUresult cuStreamCreate(void** out, unsigned /*flags*/) {
  if (out == nullptr) return kInvalidValue;
  auto* stream = new Stream();
  std::lock_guard<std::mutex> lock(state().mu);
  state().streams.insert(stream);
  *out = stream;
  return kSuccess;
}

CUresult cuStreamDestroy_v2(void* handle) {
  auto* stream = static_cast<Stream*>(handle);
  {
    std::lock_guard<std::mutex> lock(state().mu);
    if (state().streams.erase(stream) == 0) return kInvalidHandle;
  }
  delete stream;  // runs what is queued, then joins its worker
  return kSuccess;
}

CUresult cuStreamSynchronize(void* handle) {
  Stream* stream = stream_of(handle);
  if (stream == nullptr) return kInvalidHandle;
  stream->wait_for(stream->last_ticket());
  return kSuccess;
}

CUresult cuEventCreate(void** out, unsigned /*flags*/) {
  if (out == nullptr) return kInvalidValue;
  auto* event = new Event();
  std::lock_guard<std::mutex> lock(state().mu);
  state().events.insert(event);
  *out = event;
  return kSuccess;
}

CUresult cuEventRecord(void* handle, void* stream_handle) {
  auto* event = static_cast<Event*>(handle);
  if (!event_known(event)) return kInvalidHandle;
  Stream* stream = stream_of(stream_handle);
  if (stream == nullptr) return kInvalidHandle;
  const uint64_t ticket = stream->last_ticket();
  std::lock_guard<std::mutex> lock(state().mu);
  event->stream = stream;
  event->ticket = ticket;
  return kSuccess;
}

CUresult cuEventQuery(void* handle) {
  auto* event = static_cast<Event*>(handle);
  if (!event_known(event)) return kInvalidHandle;
  const Event e = recorded(event);
  return e.stream == nullptr || e.stream->reached(e.ticket) ? kSuccess : kNotReady;
}

CUresult cuEventSynchronize(void* handle) {
  auto* event = static_cast<Event*>(handle);
  if (!event_known(event)) return kInvalidHandle;
  const Event e = recorded(event);
  if (e.stream != nullptr) e.stream->wait_for(e.ticket);
  return kSuccess;
}

CUresult cuEventDestroy_v2(void* handle) {
  auto* event = static_cast<Event*>(handle);
  {
    std::lock_guard<std::mutex> lock(state().mu);
    if (state().events.erase(event) == 0) return kInvalidHandle;
  }
  delete event;
  return kSuccess;
}

CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr ptr) {
  if (data == nullptr) return kInvalidValue;
  std::lock_guard<std::mutex> lock(state().mu);
  DeviceAllocation* a = find_device(static_cast<uintptr_t>(ptr), 0, nullptr);
  if (a == nullptr) {
    // Host memory: only what cuMemHostAlloc returned is known to the driver.
    const auto p = static_cast<uintptr_t>(ptr);
    bool pinned = false;
    for (const auto& [base, size] : state().host_sizes) {
      if (p >= base && p - base < size) pinned = true;
    }
    if (!pinned) return kInvalidValue;
    if (attribute == kPointerAttrMemoryType) {
      *static_cast<unsigned*>(data) = kMemoryTypeHost;
      return kSuccess;
    }
    if (attribute == kPointerAttrDeviceOrdinal) {
      *static_cast<int*>(data) = 0;
      return kSuccess;
    }
    return kInvalidValue;
  }
  switch (attribute) {
    case kPointerAttrMemoryType: *static_cast<unsigned*>(data) = kMemoryTypeDevice; break;
    case kPointerAttrDeviceOrdinal: *static_cast<int*>(data) = a->device; break;
    case kPointerAttrIsManaged: *static_cast<int*>(data) = 0; break;
    case kPointerAttrSyncMemops: *static_cast<int*>(data) = a->sync_memops ? 1 : 0; break;
    case kPointerAttrBufferId: {
      const char* off = std::getenv("RDMAXFER_CUDA_STANDIN_NO_BUFFER_ID");
      if (off != nullptr && *off != '\0') return kInvalidValue;
      *static_cast<unsigned long long*>(data) = a->buffer_id;
      break;
    }
    default: return kInvalidValue;
  }
  return kSuccess;
}

CUresult cuPointerSetAttribute(const void* value, int attribute, CUdeviceptr ptr) {
  if (value == nullptr || attribute != kPointerAttrSyncMemops) return kInvalidValue;
  std::lock_guard<std::mutex> lock(state().mu);
  DeviceAllocation* a = find_device(static_cast<uintptr_t>(ptr), 0, nullptr);
  if (a == nullptr) return kInvalidValue;
  a->sync_memops = *static_cast<const unsigned*>(value) != 0;
  return kSuccess;
}

// A driver without dmabuf, unless RDMAXFER_CUDA_STANDIN_DMABUF=1: then the export checks its
// arguments as the driver does (the range page-aligned, inside one allocation, DMA_BUF_FD),
// hands out a memfd of the allocation's size, and is recorded for rdmaxfer_standin_last_export.
CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr ptr, size_t size, int type,
                                       unsigned long long flags) {
  const char* on = std::getenv("RDMAXFER_CUDA_STANDIN_DMABUF");
  if (on == nullptr || std::strcmp(on, "1") != 0) return kNotSupported;
  constexpr int kDmaBufFd = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
  const size_t page = page_size();
  if (handle == nullptr || type != kDmaBufFd || flags != 0 || size == 0 || ptr % page != 0 ||
      size % page != 0) {
    return kInvalidValue;
  }
  std::lock_guard<std::mutex> lock(state().mu);
  uintptr_t base = 0;
  DeviceAllocation* a = find_device(static_cast<uintptr_t>(ptr), 0, &base);
  // The allocation's whole pages may be exported (the driver allocates in pages too).
  if (a == nullptr || ptr - base + size > a->mapped) return kInvalidValue;
  const int fd = memfd_create("rdmaxfer-cuda-standin-dmabuf", MFD_CLOEXEC);
  if (fd < 0) return kOutOfMemory;
  *static_cast<int*>(handle) = fd;
  state().last_export_ptr = ptr;
  state().last_export_size = size;
  return kSuccess;
}

// For the tests: the range of the last successful dmabuf export.
void rdmaxfer_standin_last_export(CUdeviceptr* ptr, size_t* size) {
  std::lock_guard<std::mutex> lock(state().mu);
  *ptr = state().last_export_ptr;
  *size = state().last_export_size;
}

CUresult cuGetErrorName(CUresult error, const char** out) {
  if (out == nullptr) return kInvalidValue;
  switch (error) {
    case kSuccess: *out = "CUDA_SUCCESS"; break;
    case kInvalidValue: *out = "CUDA_ERROR_INVALID_VALUE"; break;
    case kOutOfMemory: *out = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case kNotInitialized: *out = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case 100: *out = "CUDA_ERROR_NO_DEVICE"; break;
    case kInvalidDevice: *out = "CUDA_ERROR_INVALID_DEVICE"; break;
    case kInvalidHandle: *out = "CUDA_ERROR_INVALID_HANDLE"; break;
    case kNotReady: *out = "CUDA_ERROR_NOT_READY"; break;
    case kNotSupported: *out = "CUDA_ERROR_NOT_SUPPORTED"; break;
    default: *out = nullptr; return kInvalidValue;
  }
  return kSuccess;
}

CUresult cuGetErrorString(CUresult error, const char** out) {
  if (out == nullptr) return kInvalidValue;
  switch (error) {
    case kSuccess: *out = "no error"; break;
    case kInvalidValue: *out = "invalid argument"; break;
    case kOutOfMemory: *out = "out of memory"; break;
    case kNotInitialized: *out = "initialization error"; break;
    case 100: *out = "no CUDA-capable device is detected"; break;
    case kInvalidDevice: *out = "invalid device ordinal"; break;
    case kInvalidHandle: *out = "invalid resource handle"; break;
    case kNotReady: *out = "device not ready"; break;
    case kNotSupported: *out = "operation not supported"; break;
    default: *out = nullptr; return kInvalidValue;
  }
  return kSuccess;
}

}  // extern "C"
