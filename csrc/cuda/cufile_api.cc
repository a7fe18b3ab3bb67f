#include "cuda/cufile_api.h"

#include <dlfcn.h>

#include <climits>
#include <cstdlib>

namespace rdmaxfer {

namespace {

struct LoadedCufile {
  CufileApi api;
  std::string why;  // empty when usable
  std::string library;
  std::string path;
  std::string version;
};

// The loaded library's file (resolved through links), found from one of its symbols.
std::string library_path(void* symbol) {
  Dl_info info;
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "";
  char real[PATH_MAX];
  return realpath(info.dli_fname, real) != nullptr ? real : info.dli_fname;
}

// cuFileGetVersion (libcufile 1.9+: 1000 * major + 10 * minor), else the digits after ".so."
// in the file's name (libcufile.so.1.9.1), else "".
std::string library_version(void* handle, const std::string& path) {
  using GetVersion = CUfileError (*)(int*);
  if (void* sym = dlsym(handle, "cuFileGetVersion")) {
    int v = 0;
    if (reinterpret_cast<GetVersion>(sym)(&v).err == 0 && v > 0) {
      return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
    }
  }
  const size_t at = path.rfind(".so.");
  return at == std::string::npos ? "" : path.substr(at + 4);
}

template <typename Fn>
bool find(void* handle, const char* name, Fn* out, std::string* why) {
  void* sym = dlsym(handle, name);
  if (sym == nullptr) {
    *why = std::string("no GPUDirect Storage: libcufile lacks ") + name;
    return false;
  }
  *out = reinterpret_cast<Fn>(sym);
  return true;
}

LoadedCufile load_cufile() {
  LoadedCufile l;
  const char* env = std::getenv("RDMAXFER_CUFILE_LIBRARY");
  const std::string name = env != nullptr && *env != '\0' ? env : "libcufile.so.0";
  l.library = name;
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* err = dlerror();
    l.why = "no GPUDirect Storage: " + name + " not found (" +
            (err != nullptr ? err : "dlopen failed") + "); install the CUDA toolkit's GDS package";
    return l;
  }
  l.path = library_path(dlsym(handle, "cuFileRead"));
  l.version = library_version(handle, l.path);
  CufileApi& a = l.api;
  std::string* why = &l.why;
  const bool ok = find(handle, "cuFileDriverOpen", &a.driver_open, why) &&
                  find(handle, "cuFileHandleRegister", &a.handle_register, why) &&
                  find(handle, "cuFileHandleDeregister", &a.handle_deregister, why) &&
                  find(handle, "cuFileBufRegister", &a.buf_register, why) &&
                  find(handle, "cuFileBufDeregister", &a.buf_deregister, why) &&
                  find(handle, "cuFileRead", &a.read, why);
  if (!ok) return l;
  const CUfileError e = a.driver_open();
  if (e.err != 0) l.why = "no GPUDirect Storage: " + cufile_error_text("cuFileDriverOpen", e);
  return l;
}

const LoadedCufile& loaded_cufile() {
  static const LoadedCufile loaded = load_cufile();  // thread-safe initialisation
  return loaded;
}

}  // namespace

const CufileApi* cufile_api(std::string* why) {
  const LoadedCufile& loaded = loaded_cufile();
  if (!loaded.why.empty()) {
    if (why != nullptr) *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

CufileStatus cufile_status() {
  const LoadedCufile& l = loaded_cufile();
  return CufileStatus{l.library, l.path, l.version, l.why};
}

namespace {

// The names of CUfileOpError (cufile.h, CUDA 12-13), from CU_FILE_DRIVER_NOT_INITIALIZED = 5001.
constexpr const char* kCufileErrorNames[] = {
    "DRIVER_NOT_INITIALIZED", "DRIVER_INVALID_PROPS", "DRIVER_UNSUPPORTED_LIMIT",
    "DRIVER_VERSION_MISMATCH", "DRIVER_VERSION_READ_ERROR", "DRIVER_CLOSING",
    "PLATFORM_NOT_SUPPORTED", "IO_NOT_SUPPORTED", "DEVICE_NOT_SUPPORTED", "NVFS_DRIVER_ERROR",
    "CUDA_DRIVER_ERROR", "CUDA_POINTER_INVALID", "CUDA_MEMORY_TYPE_INVALID",
    "CUDA_POINTER_RANGE_ERROR", "CUDA_CONTEXT_MISMATCH", "INVALID_MAPPING_SIZE",
    "INVALID_MAPPING_RANGE", "INVALID_FILE_TYPE", "INVALID_FILE_OPEN_FLAG", "DIO_NOT_SET",
    "EXPECTED_FILE_MODE", "INVALID_VALUE", "MEMORY_ALREADY_REGISTERED", "MEMORY_NOT_REGISTERED",
    "PERMISSION_DENIED", "DRIVER_ALREADY_OPEN", "HANDLE_NOT_REGISTERED",
    "HANDLE_ALREADY_REGISTERED", "DEVICE_NOT_FOUND", "INTERNAL_ERROR", "GETNEWFD_FAILED",
    nullptr, "NVFS_SETUP_ERROR", "IO_DISABLED", "BATCH_SUBMIT_FAILED",
    "GPU_MEMORY_PINNING_FAILED", "BATCH_FULL", "ASYNC_NOT_SUPPORTED"};
constexpr int kCufileFirstError = 5001;

// "CU_FILE_HANDLE_NOT_REGISTERED" for 5027; "" for a number without a name.
std::string cufile_error_name(int err) {
  const int i = err - kCufileFirstError;
  const int n = static_cast<int>(sizeof(kCufileErrorNames) / sizeof(kCufileErrorNames[0]));
  if (i < 0 || i >= n || kCufileErrorNames[i] == nullptr) return "";
  return std::string("CU_FILE_") + kCufileErrorNames[i];
}

}  // namespace

std::string cufile_error_text(const std::string& op, const CUfileError& e) {
  std::string text = op + ": cuFile error " + std::to_string(e.err);
  const std::string name = cufile_error_name(e.err);
  if (!name.empty()) text += " (" + name + ")";
  if (e.cu_err != 0) text += " (CUresult " + std::to_string(e.cu_err) + ")";
  return text;
}

}  // namespace rdmaxfer
