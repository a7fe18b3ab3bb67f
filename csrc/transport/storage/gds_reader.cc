#include "transport/storage/gds_reader.h"

#include <algorithm>
#include <cerrno>
#include <memory>

#include "common/error.h"
#include "cuda/cuda_context.h"
#include "cuda/cufile_api.h"

namespace rdmaxfer {

namespace {

// A cuFile handle of an open file; deregistered on destruction.
class CufileHandle {
 public:
  CufileHandle(const CufileApi& api, int fd, const std::string& path) : api_(api) {
    CUfileDescr d{};
    d.type = 1;  // CU_FILE_HANDLE_TYPE_OPAQUE_FD
    d.handle.fd = fd;
    const CUfileError e = api.handle_register(&handle_, &d);
    if (e.err != 0) {  // cuFile does not take this file (its file system, mount or open flags)
      throw Error(ErrorKind::kUnsupported,
                  cufile_error_text("cuFileHandleRegister of '" + path + "'", e));
    }
  }
  ~CufileHandle() { api_.handle_deregister(handle_); }
  CufileHandle(const CufileHandle&) = delete;
  CufileHandle& operator=(const CufileHandle&) = delete;
  void* get() const { return handle_; }

 private:
  const CufileApi& api_;
  void* handle_ = nullptr;
};

// Device memory registered with cuFileBufRegister; deregistered on destruction.
class CufileBuffer {
 public:
  CufileBuffer(const CufileApi& api, uint64_t base, uint64_t length) : api_(api), base_(base) {
    const CUfileError e = api.buf_register(reinterpret_cast<const void*>(base), length, 0);
    if (e.err != 0) {
      throw Error(ErrorKind::kRegistration,
                  cufile_error_text("cuFileBufRegister of " + std::to_string(length) +
                                        " bytes of device memory", e));
    }
  }
  ~CufileBuffer() { api_.buf_deregister(reinterpret_cast<const void*>(base_)); }
  CufileBuffer(const CufileBuffer&) = delete;
  CufileBuffer& operator=(const CufileBuffer&) = delete;

 private:
  const CufileApi& api_;
  uint64_t base_;
};

}  // namespace

std::string gds_unavailable() {
  std::string why;
  return cufile_api(&why) != nullptr ? "" : why;
}

GdsStats read_file_gds(int fd, const std::string& path, uint64_t file_size, int device,
                       const std::vector<GdsRange>& ranges, uint64_t chunk) {
  std::string why;
  const CufileApi* api = cufile_api(&why);
  if (api == nullptr) throw Error(ErrorKind::kUnsupported, why);
  if (chunk == 0) throw Error(ErrorKind::kInvalidArgument, "GDS reads of 0 bytes");
  for (const GdsRange& r : ranges) {
    if (r.file_offset + r.length > file_size) {
      throw Error(ErrorKind::kInvalidArgument,
                  "'" + path + "' is truncated: it ends at offset " + std::to_string(file_size) +
                      ", before the range at offset " + std::to_string(r.file_offset));
    }
  }
  CudaContext::get(device)->bind();
  CufileHandle handle(*api, fd, path);
  GdsStats stats;
  for (const GdsRange& r : ranges) {
    if (r.length == 0) continue;
    CufileBuffer registered(*api, r.dest, r.length);
    for (uint64_t at = 0; at < r.length;) {
      const uint64_t n = std::min(chunk, r.length - at);
      const ssize_t got = api->read(handle.get(), reinterpret_cast<void*>(r.dest), n,
                                    static_cast<off_t>(r.file_offset + at), static_cast<off_t>(at));
      const std::string where = "cuFileRead of '" + path + "' at offset " +
                                std::to_string(r.file_offset + at);
      if (got < 0) {
        if (got == -1) throw_errno(ErrorKind::kTransport, where, errno);
        const CUfileError e{static_cast<int>(-got), 0};
        throw Error(ErrorKind::kTransport, cufile_error_text(where, e));
      }
      if (got == 0) {
        throw Error(ErrorKind::kInvalidArgument, "'" + path + "' is truncated: it ends at offset " +
                                                     std::to_string(r.file_offset + at));
      }
      at += static_cast<uint64_t>(got);
      stats.bytes_read += static_cast<uint64_t>(got);
      ++stats.reads;
    }
  }
  return stats;
}

}  // namespace rdmaxfer
