// The stand-in driver's CUDA IPC (cuIpcGetMemHandle, cuIpcOpenMemHandle_v2,
// cuIpcCloseMemHandle), its cuMemGetAddressRange_v2 and cuMemcpyDtoDAsync_v2, over the memfd
// behind each stand-in allocation (cuda_standin.cc).
//
// What it keeps honest:
// - Another process really maps the same pages. A handle names the exporting process, the
//   memfd's descriptor there and its inode; cuIpcOpenMemHandle opens /proc/<pid>/fd/<fd> (the
//   same user may, as CUDA IPC needs one host), checks the inode (a reused descriptor number is
//   refused), and maps it as a new device allocation: PROT_NONE at the address handed out, the
//   copies through a second mapping, so the opener's CPU cannot touch it either.
// - As in the driver, the handle names the allocation's base (cuIpcGetMemHandle of any other
//   address fails), a process cannot open its own handle, imported memory is released with
//   cuIpcCloseMemHandle (cuMemFree refuses it), and a handle whose exporter exited fails.
// - rdmaxfer_standin_ipc_opened() counts the allocations opened and not yet closed, so a test
//   sees that a connection's end closed what it opened.
#include <fcntl.h>
#include <sys/stat.h>

#include <string>

#include "standin_core.h"

using namespace standin;  // NOLINT: the driver's own types and state

namespace {

constexpr char kMagic[8] = {'R', 'X', 'S', 'T', 'D', 'I', 'P', 'C'};
constexpr CUresult kInvalidContext = 201;  // CUDA_ERROR_INVALID_CONTEXT

struct IpcHandle {  // fits CUipcMemHandle's 64 bytes
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t inode;
  uint64_t size;
  char unused[32];
};
static_assert(sizeof(IpcHandle) == 64, "CUipcMemHandle is 64 bytes");

int g_opened = 0;  // imported allocations not yet closed (under state().mu)

}  // namespace

extern "C" {

CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(state().mu);
  uintptr_t start = 0;
  DeviceAllocation* a = find_device(static_cast<uintptr_t>(ptr), 0, &start);
  if (a == nullptr) return kInvalidValue;
  if (base != nullptr) *base = start;
  if (size != nullptr) *size = a->size;
  return kSuccess;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void* stream) {
  if (n == 0) return kSuccess;
  uint8_t* to = shadow_of(dst, n);
  uint8_t* from = shadow_of(src, n);
  if (to == nullptr || from == nullptr) return kInvalidValue;
  return enqueue_copy(to, from, n, stream);
}

CUresult cuIpcGetMemHandle(void* out, CUdeviceptr ptr) {
  if (out == nullptr) return kInvalidValue;
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().device_allocations.find(static_cast<uintptr_t>(ptr));
  // As the driver: cuMemCreate'd (VMM) memory has no legacy IPC handle.
  if (it == state().device_allocations.end() || it->second.imported || it->second.vmm != 0) {
    return kInvalidValue;
  }
  struct stat st {};
  if (fstat(it->second.fd, &st) != 0) return kInvalidValue;
  IpcHandle h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.pid = static_cast<int32_t>(getpid());
  h.fd = it->second.fd;
  h.inode = static_cast<uint64_t>(st.st_ino);
  h.size = it->second.size;
  std::memcpy(out, &h, sizeof(h));
  return kSuccess;
}

// CUipcMemHandle is passed by value (a 64-byte struct of chars).
struct CUipcMemHandleArg {
  char reserved[64];
};

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* out, CUipcMemHandleArg handle, unsigned /*flags*/) {
  if (out == nullptr) return kInvalidValue;
  IpcHandle h{};
  std::memcpy(&h, handle.reserved, sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.size == 0) return kInvalidValue;
  if (h.pid == static_cast<int32_t>(getpid())) return kInvalidContext;  // as the driver
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return kInvalidValue;  // the exporter exited or freed the allocation
  struct stat st {};
  const size_t page = page_size();
  const size_t mapped = (h.size + page - 1) / page * page;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != h.inode ||
      static_cast<size_t>(st.st_size) < mapped) {
    close(fd);
    return kInvalidValue;
  }
  void* device = mmap(nullptr, mapped, PROT_NONE, MAP_SHARED, fd, 0);
  void* shadow = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (device == MAP_FAILED || shadow == MAP_FAILED) {
    if (device != MAP_FAILED) munmap(device, mapped);
    if (shadow != MAP_FAILED) munmap(shadow, mapped);
    return kOutOfMemory;
  }
  DeviceAllocation a;
  a.shadow = static_cast<uint8_t*>(shadow);
  a.mapped = mapped;
  a.size = h.size;
  a.device = current_device;
  a.imported = true;
  std::lock_guard<std::mutex> lock(state().mu);
  add_device(reinterpret_cast<uintptr_t>(device), a);
  ++g_opened;
  *out = reinterpret_cast<uintptr_t>(device);
  return kSuccess;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr ptr) {
  DeviceAllocation a;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    auto it = state().device_allocations.find(static_cast<uintptr_t>(ptr));
    if (it == state().device_allocations.end() || !it->second.imported) return kInvalidValue;
    a = it->second;
    state().device_allocations.erase(it);
    --g_opened;
  }
  munmap(reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)), a.mapped);
  munmap(a.shadow, a.mapped);
  return kSuccess;
}

// For the tests: allocations opened from other processes and not yet closed.
int rdmaxfer_standin_ipc_opened() {
  std::lock_guard<std::mutex> lock(state().mu);
  return g_opened;
}

}  // extern "C"
