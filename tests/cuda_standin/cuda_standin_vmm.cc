// The stand-in driver's VMM API (cuMemCreate, cuMemAddressReserve/Free, cuMemMap/Unmap,
// cuMemSetAccess, cuMemRelease, cuMemRetainAllocationHandle, cuMemExportToShareableHandle and
// cuMemImportFromShareableHandle), over one memfd per physical allocation.
//
// What it keeps honest:
// - A mapped range is device memory like cuMemAlloc's: PROT_NONE at its address (the CPU
//   faults on it), the copies through a second mapping; cuMemGetAddressRange names the mapped
//   range, and cuIpcGetMemHandle refuses it (cuda_standin_ipc.cc), as the driver does.
// - cuMemExportToShareableHandle (POSIX fd only) returns a duplicate of the memfd, which the
//   caller owns and closes; another process imports it after receiving it (SCM_RIGHTS), maps
//   it and sees the same pages. Physical memory lives until its last handle and mapping are
//   released.
// - rdmaxfer_standin_vmm_physical() counts the physical allocations alive, so a test sees that
//   what a connection imported was released.
#include <fcntl.h>
#include <sys/stat.h>

#include "standin_core.h"

using namespace standin;  // NOLINT: the driver's own types and state

namespace {

using Handle = unsigned long long;  // CUmemGenericAllocationHandle
constexpr int kHandleTypePosixFd = 1;      // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
constexpr int kLocationTypeDevice = 1;     // CU_MEM_LOCATION_TYPE_DEVICE
constexpr int kAccessReadWrite = 3;        // CU_MEM_ACCESS_FLAGS_PROT_READWRITE

struct Location {  // CUmemLocation
  int type;
  int id;
};
struct AccessDesc {  // CUmemAccessDesc
  Location location;
  int flags;
};

size_t rounded(size_t size) {
  const size_t page = page_size();
  return (size + page - 1) / page * page;
}

// Adds a physical allocation over `fd` (owned from now on). Caller holds state().mu.
Handle add_physical(int fd, size_t size) {
  State& s = state();
  const Handle h = s.next_physical++;
  s.physical[h] = State::Physical{fd, size, 1};
  return h;
}

// Drops one reference of `h`; the memfd is closed with the last. Caller holds state().mu.
void unref(Handle h) {
  auto it = state().physical.find(h);
  if (it == state().physical.end()) return;
  if (--it->second.refs == 0) {
    close(it->second.fd);
    state().physical.erase(it);
  }
}

}  // namespace

extern "C" {

CUresult cuMemCreate(Handle* out, size_t size, const void* prop, unsigned long long flags) {
  if (out == nullptr || prop == nullptr || size == 0 || flags != 0) return kInvalidValue;
  const int fd = memfd_create("rdmaxfer-cuda-standin-vmm", MFD_CLOEXEC);
  if (fd < 0) return kOutOfMemory;
  if (ftruncate(fd, static_cast<off_t>(rounded(size))) != 0) {
    close(fd);
    return kOutOfMemory;
  }
  std::lock_guard<std::mutex> lock(state().mu);
  *out = add_physical(fd, size);
  return kSuccess;
}

CUresult cuMemRelease(Handle h) {
  std::lock_guard<std::mutex> lock(state().mu);
  if (state().physical.count(h) == 0) return kInvalidValue;
  unref(h);
  return kSuccess;
}

CUresult cuMemAddressReserve(CUdeviceptr* out, size_t size, size_t /*alignment*/,
                             CUdeviceptr addr, unsigned long long flags) {
  if (out == nullptr || size == 0 || addr != 0 || flags != 0) return kInvalidValue;
  const size_t mapped = rounded(size);
  void* p = mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return kOutOfMemory;
  std::lock_guard<std::mutex> lock(state().mu);
  state().reserved[reinterpret_cast<uintptr_t>(p)] = mapped;
  *out = reinterpret_cast<uintptr_t>(p);
  return kSuccess;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().reserved.find(static_cast<uintptr_t>(ptr));
  if (it == state().reserved.end() || it->second != rounded(size)) return kInvalidValue;
  munmap(reinterpret_cast<void*>(it->first), it->second);
  state().reserved.erase(it);
  return kSuccess;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, Handle h,
                  unsigned long long flags) {
  if (offset != 0 || flags != 0) return kInvalidValue;  // "currently unused, must be zero"
  std::lock_guard<std::mutex> lock(state().mu);
  State& s = state();
  auto res = s.reserved.upper_bound(static_cast<uintptr_t>(ptr));
  if (res == s.reserved.begin()) return kInvalidValue;
  --res;
  const size_t mapped = rounded(size);
  const uintptr_t at = static_cast<uintptr_t>(ptr);
  auto phys = s.physical.find(h);
  if (at + mapped > res->first + res->second || phys == s.physical.end() ||
      phys->second.size < size || find_device(at, 0, nullptr) != nullptr) {
    return kInvalidValue;
  }
  void* device = mmap(reinterpret_cast<void*>(at), mapped, PROT_NONE, MAP_SHARED | MAP_FIXED,
                      phys->second.fd, 0);
  void* shadow = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, phys->second.fd, 0);
  if (device == MAP_FAILED || shadow == MAP_FAILED) {
    if (shadow != MAP_FAILED) munmap(shadow, mapped);
    return kOutOfMemory;
  }
  DeviceAllocation a;
  a.shadow = static_cast<uint8_t*>(shadow);
  a.mapped = mapped;
  a.size = size;
  a.device = current_device;
  a.vmm = h;
  add_device(at, a);
  ++phys->second.refs;  // the mapping holds the physical memory
  return kSuccess;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().device_allocations.find(static_cast<uintptr_t>(ptr));
  if (it == state().device_allocations.end() || it->second.vmm == 0 ||
      it->second.mapped != rounded(size)) {
    return kInvalidValue;
  }
  const DeviceAllocation a = it->second;
  state().device_allocations.erase(it);
  munmap(a.shadow, a.mapped);
  // The range stays reserved: PROT_NONE anonymous memory again.
  mmap(reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)), a.mapped, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  unref(a.vmm);
  return kSuccess;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const AccessDesc* desc, size_t count) {
  if (desc == nullptr || count == 0) return kInvalidValue;
  std::lock_guard<std::mutex> lock(state().mu);
  DeviceAllocation* a = find_device(static_cast<uintptr_t>(ptr), size, nullptr);
  if (a == nullptr || a->vmm == 0) return kInvalidValue;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != kLocationTypeDevice || desc[i].location.id < 0 ||
        desc[i].location.id >= state().devices || desc[i].flags != kAccessReadWrite) {
      return kInvalidValue;
    }
  }
  return kSuccess;
}

CUresult cuMemRetainAllocationHandle(Handle* out, void* addr) {
  if (out == nullptr) return kInvalidValue;
  std::lock_guard<std::mutex> lock(state().mu);
  DeviceAllocation* a = find_device(reinterpret_cast<uintptr_t>(addr), 0, nullptr);
  if (a == nullptr || a->vmm == 0) return kInvalidValue;  // not cuMemMap'd memory
  ++state().physical[a->vmm].refs;
  *out = a->vmm;
  return kSuccess;
}

CUresult cuMemExportToShareableHandle(void* out, Handle h, int type, unsigned long long flags) {
  if (out == nullptr || type != kHandleTypePosixFd || flags != 0) return kInvalidValue;
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().physical.find(h);
  if (it == state().physical.end()) return kInvalidValue;
  const int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return kOutOfMemory;
  *static_cast<int*>(out) = fd;
  return kSuccess;
}

CUresult cuMemImportFromShareableHandle(Handle* out, void* os_handle, int type) {
  if (out == nullptr || type != kHandleTypePosixFd) return kInvalidValue;
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(os_handle));
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= 0) return kInvalidValue;
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);  // the caller keeps (and closes) its fd
  if (own < 0) return kOutOfMemory;
  std::lock_guard<std::mutex> lock(state().mu);
  *out = add_physical(own, static_cast<size_t>(st.st_size));
  return kSuccess;
}

// For the tests: physical allocations alive in this process (created or imported).
int rdmaxfer_standin_vmm_physical() {
  std::lock_guard<std::mutex> lock(state().mu);
  return static_cast<int>(state().physical.size());
}

}  // extern "C"
