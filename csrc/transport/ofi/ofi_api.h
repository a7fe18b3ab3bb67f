// libfabric, loaded at run time.
//
// libfabric.so.1 is opened once with dlopen and its few exported entry points are looked up by
// versioned symbol (FABRIC_1.3 for fi_getinfo/fi_freeinfo/fi_dupinfo, FABRIC_1.1 for fi_fabric,
// FABRIC_1.0 for fi_strerror/fi_version) into one table of function pointers. Every other
// libfabric call (fi_domain, fi_endpoint, fi_mr_reg, fi_writemsg, fi_cq_sread ...) is an inline
// function of the headers that goes through the object's ops table and needs no symbol. Nothing
// in rdmaxfer links against libfabric, so importing the module never fails on a machine without
// it: the ofi transport reports why it is unavailable instead. The headers are vendored
// (third_party/libfabric), so every build has the transport.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <cstdint>
#include <string>

#include "common/error.h"

namespace rdmaxfer {

struct OfiApi {
  int (*getinfo)(uint32_t, const char*, const char*, uint64_t, const fi_info*,
                 fi_info**) = nullptr;
  void (*freeinfo)(fi_info*) = nullptr;
  fi_info* (*dupinfo)(const fi_info*) = nullptr;
  int (*fabric)(fi_fabric_attr*, fid_fabric**, void*) = nullptr;
  const char* (*strerror)(int) = nullptr;
  uint32_t (*version)() = nullptr;
};

// The version rdmaxfer asks for (the vendored headers' API, libfabric >= 1.17).
constexpr uint32_t kOfiApiVersion = FI_VERSION(1, 17);

// The loaded table, or nullptr with `why` set ("libfabric.so.1 not found: ..."). Loads once;
// later calls return the same answer. Thread-safe.
const OfiApi* ofi_api(std::string* why);
// The table; throws Error(kUnsupported) with the reason when libfabric cannot be loaded.
const OfiApi& ofi();

// "fi_xxx: text (FI error N)" for the negative return `ret` of a libfabric call.
std::string ofi_error_text(const std::string& op, int ret);
// Throws ofi_error_text as an Error of `kind` (errno = -ret).
[[noreturn]] void throw_ofi(const std::string& op, int ret,
                            ErrorKind kind = ErrorKind::kTransport);
// The Error kind of a failed completion (its errno and the provider's own): refused keys and
// access as kRemoteAccess, a peer that is gone as kConnection, anything else kTransport.
ErrorKind ofi_completion_kind(int err, int prov_errno);

// Owns a fi_info list (fi_freeinfo).
class OfiInfo {
 public:
  OfiInfo() = default;
  explicit OfiInfo(fi_info* info) : info_(info) {}
  OfiInfo(OfiInfo&& other) noexcept : info_(other.info_) { other.info_ = nullptr; }
  OfiInfo& operator=(OfiInfo&& other) noexcept;
  OfiInfo(const OfiInfo&) = delete;
  OfiInfo& operator=(const OfiInfo&) = delete;
  ~OfiInfo();
  fi_info* get() const { return info_; }
  fi_info* operator->() const { return info_; }

 private:
  fi_info* info_ = nullptr;
};

// Closes a fid (fi_close) on destruction.
template <typename T>
class OfiHandle {
 public:
  OfiHandle() = default;
  explicit OfiHandle(T* handle) : handle_(handle) {}
  OfiHandle(OfiHandle&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }
  OfiHandle& operator=(OfiHandle&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = other.handle_;
      other.handle_ = nullptr;
    }
    return *this;
  }
  OfiHandle(const OfiHandle&) = delete;
  OfiHandle& operator=(const OfiHandle&) = delete;
  ~OfiHandle() { reset(); }
  T* get() const { return handle_; }
  T* operator->() const { return handle_; }
  T** out() { return &handle_; }
  void reset() {
    if (handle_ != nullptr) fi_close(&handle_->fid);
    handle_ = nullptr;
  }

 private:
  T* handle_ = nullptr;
};

}  // namespace rdmaxfer
