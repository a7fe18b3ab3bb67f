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

std::string cufile_error_text(const std::string& op, const CUfileError& e) {
  std::string text = op + ": cuFile error " + std::to_string(e.err);
  if (e.cu_err != 0) text += " (CUresult " + std::to_string(e.cu_err) + ")";
  return text;
}

}  // namespace rdmaxfer
