#include "cuda/cufile_api.h"

#include <dlfcn.h>

#include <cstdlib>

namespace rdmaxfer {

namespace {

struct LoadedCufile {
  CufileApi api;
  std::string why;  // empty when usable
};

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
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* err = dlerror();
    l.why = "no GPUDirect Storage: " + name + " not found (" +
            (err != nullptr ? err : "dlopen failed") + "); install the CUDA toolkit's GDS package";
    return l;
  }
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

}  // namespace

const CufileApi* cufile_api(std::string* why) {
  static const LoadedCufile loaded = load_cufile();  // thread-safe initialisation
  if (!loaded.why.empty()) {
    if (why != nullptr) *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

std::string cufile_error_text(const std::string& op, const CUfileError& e) {
  std::string text = op + ": cuFile error " + std::to_string(e.err);
  if (e.cu_err != 0) text += " (CUresult " + std::to_string(e.cu_err) + ")";
  return text;
}

}  // namespace rdmaxfer
