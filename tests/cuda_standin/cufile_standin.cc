// The stand-in cuFile (GPUDirect Storage) API over the stand-in driver's "device" memory: a
// cuFileRead is a pread into the allocation's read-write shadow, so CI runs rdmaxfer's GDS path
// (csrc/cuda/cufile_api.h) without a GPU. Registered buffers and handles are checked the way
// libcufile checks them: a read needs an open driver and a registered handle, a registered
// buffer must be device memory. Tests only.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <set>

#include "standin_core.h"

namespace {

struct CUfileError_t {
  int err;      // CUfileOpError: 0 success
  int cu_err;   // CUresult
};

struct CUfileDescr_t {
  int type;  // CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};

constexpr int kFileSuccess = 0;
constexpr int kDriverNotInitialized = 5001;
constexpr int kInvalidValue = 5022;
constexpr int kMemoryNotRegistered = 5024;
constexpr int kNotOpenedODirect = 5031;
constexpr int kHandleNotRegistered = 5027;

struct CufileState {
  std::mutex mu;
  bool open = false;
  std::set<int*> handles;
  std::set<uintptr_t> buffers;
};

CufileState& cufile() {
  static CufileState* s = new CufileState();
  return *s;
}

CUfileError_t status(int err) { return CUfileError_t{err, 0}; }

}  // namespace

extern "C" {

CUfileError_t cuFileDriverOpen() {
  std::lock_guard<std::mutex> lock(cufile().mu);
  cufile().open = true;
  return status(kFileSuccess);
}

// The stand-in reports itself as cuFile 1.15 (1000 * major + 10 * minor, as libcufile does).
CUfileError_t cuFileGetVersion(int* version) {
  if (version == nullptr) return status(kInvalidValue);
  *version = 1150;
  return status(kFileSuccess);
}

CUfileError_t cuFileHandleRegister(void** fh, CUfileDescr_t* descr) {
  if (fh == nullptr || descr == nullptr || descr->type != 1) return status(kInvalidValue);
  const int flags = fcntl(descr->handle.fd, F_GETFL);
  if (flags < 0) return status(kInvalidValue);
  if ((flags & O_DIRECT) == 0) return status(kNotOpenedODirect);
  // As libcufile 1.15 answered for a file on a file system it does not take (seen on a GPU
  // machine's /tmp without nvidia-fs)
  if (std::getenv("RDMAXFER_CUFILE_STANDIN_REFUSE_FILES") != nullptr) {
    return status(kHandleNotRegistered);
  }
  std::lock_guard<std::mutex> lock(cufile().mu);
  if (!cufile().open) return status(kDriverNotInitialized);
  int* handle = new int(descr->handle.fd);
  cufile().handles.insert(handle);
  *fh = handle;
  return status(kFileSuccess);
}

void cuFileHandleDeregister(void* fh) {
  std::lock_guard<std::mutex> lock(cufile().mu);
  auto* handle = static_cast<int*>(fh);
  if (cufile().handles.erase(handle) != 0) delete handle;
}

CUfileError_t cuFileBufRegister(const void* base, size_t length, int /*flags*/) {
  if (standin::shadow_of(reinterpret_cast<uintptr_t>(base), length) == nullptr) {
    return status(kInvalidValue);  // not device memory
  }
  std::lock_guard<std::mutex> lock(cufile().mu);
  cufile().buffers.insert(reinterpret_cast<uintptr_t>(base));
  return status(kFileSuccess);
}

CUfileError_t cuFileBufDeregister(const void* base) {
  std::lock_guard<std::mutex> lock(cufile().mu);
  if (cufile().buffers.erase(reinterpret_cast<uintptr_t>(base)) == 0) {
    return status(kMemoryNotRegistered);
  }
  return status(kFileSuccess);
}

ssize_t cuFileRead(void* fh, void* base, size_t size, off_t file_offset, off_t buf_offset) {
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(cufile().mu);
    if (cufile().handles.count(static_cast<int*>(fh)) == 0) return -kInvalidValue;
    fd = *static_cast<int*>(fh);
  }
  const uintptr_t at = reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(buf_offset);
  uint8_t* to = standin::shadow_of(at, size);
  if (to == nullptr) return -kInvalidValue;
  // libcufile reads any offset and length (its bounce buffers take the unaligned ends); the
  // fd is O_DIRECT, so the stand-in reads through a second, buffered descriptor.
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  const int plain = open(path, O_RDONLY | O_CLOEXEC);
  if (plain < 0) return -1;
  size_t done = 0;
  while (done < size) {
    const ssize_t n = pread(plain, to + done, size - done, file_offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(plain);
  return static_cast<ssize_t>(done);
}

}  // extern "C"
