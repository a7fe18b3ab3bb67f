#include "cuda/cuda_api.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <utility>

#include "common/error.h"

namespace rdmaxfer {

namespace {

using ErrorTextFn = CUresult (*)(CUresult, const char**);
std::atomic<ErrorTextFn> g_error_name{nullptr};
std::atomic<ErrorTextFn> g_error_string{nullptr};

struct Loaded {
  CudaApi api;
  std::string why;  // empty when usable
};

template <typename Fn>
bool lookup(void* handle, const char* name, Fn* out, std::string* why) {
  void* sym = dlsym(handle, name);
  if (sym == nullptr) {
    if (why != nullptr) {
      *why = std::string("no CUDA: libcuda.so.1 lacks ") + name +
             " (the NVIDIA driver is too old; install a driver for CUDA 11 or newer)";
    }
    return false;
  }
  *out = reinterpret_cast<Fn>(sym);
  return true;
}

Loaded load() {
  Loaded l;
  // RDMAXFER_CUDA_LIBRARY overrides the library (tests use a missing path to see "no CUDA").
  const char* env = std::getenv("RDMAXFER_CUDA_LIBRARY");
  const std::string name = env != nullptr && *env != '\0' ? env : "libcuda.so.1";
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* err = dlerror();
    l.why = "no CUDA: " + name + " not found (" + (err != nullptr ? err : "dlopen failed") +
            "); GPU buffers need the NVIDIA driver";
    return l;
  }
  CudaApi& a = l.api;
  std::string* why = &l.why;
  const bool ok =
      lookup(handle, "cuInit", &a.init, why) &&
      lookup(handle, "cuDriverGetVersion", &a.driver_get_version, why) &&
      lookup(handle, "cuDeviceGetCount", &a.device_get_count, why) &&
      lookup(handle, "cuDeviceGet", &a.device_get, why) &&
      lookup(handle, "cuDeviceGetName", &a.device_get_name, why) &&
      lookup(handle, "cuDeviceGetAttribute", &a.device_get_attribute, why) &&
      lookup(handle, "cuDeviceGetPCIBusId", &a.device_get_pci_bus_id, why) &&
      lookup(handle, "cuDeviceTotalMem_v2", &a.device_total_mem, why) &&
      lookup(handle, "cuDevicePrimaryCtxRetain", &a.primary_ctx_retain, why) &&
      lookup(handle, "cuDevicePrimaryCtxRelease_v2", &a.primary_ctx_release, why) &&
      lookup(handle, "cuCtxSetCurrent", &a.ctx_set_current, why) &&
      lookup(handle, "cuMemAlloc_v2", &a.mem_alloc, why) &&
      lookup(handle, "cuMemFree_v2", &a.mem_free, why) &&
      lookup(handle, "cuMemHostAlloc", &a.mem_host_alloc, why) &&
      lookup(handle, "cuMemFreeHost", &a.mem_free_host, why) &&
      lookup(handle, "cuMemcpyDtoHAsync_v2", &a.memcpy_dtoh_async, why) &&
      lookup(handle, "cuMemcpyHtoDAsync_v2", &a.memcpy_htod_async, why) &&
      lookup(handle, "cuStreamCreate", &a.stream_create, why) &&
      lookup(handle, "cuStreamDestroy_v2", &a.stream_destroy, why) &&
      lookup(handle, "cuStreamSynchronize", &a.stream_synchronize, why) &&
      lookup(handle, "cuEventCreate", &a.event_create, why) &&
      lookup(handle, "cuEventRecord", &a.event_record, why) &&
      lookup(handle, "cuEventSynchronize", &a.event_synchronize, why) &&
      lookup(handle, "cuEventQuery", &a.event_query, why) &&
      lookup(handle, "cuEventDestroy_v2", &a.event_destroy, why) &&
      lookup(handle, "cuPointerGetAttribute", &a.pointer_get_attribute, why) &&
      lookup(handle, "cuGetErrorName", &a.get_error_name, why) &&
      lookup(handle, "cuGetErrorString", &a.get_error_string, why);
  if (!ok) return l;
  lookup(handle, "cuPointerSetAttribute", &a.pointer_set_attribute, nullptr);
  lookup(handle, "cuMemGetHandleForAddressRange", &a.mem_get_handle_for_address_range, nullptr);
  lookup(handle, "cuMemGetAddressRange_v2", &a.mem_get_address_range, nullptr);
  lookup(handle, "cuMemcpyDtoDAsync_v2", &a.memcpy_dtod_async, nullptr);
  lookup(handle, "cuIpcGetMemHandle", &a.ipc_get_mem_handle, nullptr);
  lookup(handle, "cuIpcOpenMemHandle_v2", &a.ipc_open_mem_handle, nullptr);
  lookup(handle, "cuIpcCloseMemHandle", &a.ipc_close_mem_handle, nullptr);
  lookup(handle, "cuDeviceCanAccessPeer", &a.device_can_access_peer, nullptr);
  lookup(handle, "cuMemRetainAllocationHandle", &a.mem_retain_allocation_handle, nullptr);
  lookup(handle, "cuMemExportToShareableHandle", &a.mem_export_to_shareable_handle, nullptr);
  lookup(handle, "cuMemImportFromShareableHandle", &a.mem_import_from_shareable_handle, nullptr);
  lookup(handle, "cuMemRelease", &a.mem_release, nullptr);
  lookup(handle, "cuMemAddressReserve", &a.mem_address_reserve, nullptr);
  lookup(handle, "cuMemAddressFree", &a.mem_address_free, nullptr);
  lookup(handle, "cuMemMap", &a.mem_map, nullptr);
  lookup(handle, "cuMemUnmap", &a.mem_unmap, nullptr);
  lookup(handle, "cuMemSetAccess", &a.mem_set_access, nullptr);
  dlerror();
  g_error_name.store(a.get_error_name);
  g_error_string.store(a.get_error_string);
  const CUresult r = a.init(0);
  if (r != kCudaSuccess) {
    l.why = "no CUDA: " + cuda_error_text("cuInit", r);
    if (r == kCudaErrorNoDevice) l.why += "; no GPU is visible (check CUDA_VISIBLE_DEVICES)";
  }
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();  // thread-safe static initialisation
  return l;
}

}  // namespace

const CudaApi* cuda_api(std::string* why) {
  const Loaded& l = loaded();
  if (!l.why.empty()) {
    if (why != nullptr) *why = l.why;
    return nullptr;
  }
  return &l.api;
}

const CudaApi& cuda() {
  std::string why;
  const CudaApi* api = cuda_api(&why);
  if (api == nullptr) throw Error(ErrorKind::kUnsupported, why);
  return *api;
}

std::string cuda_ipc_unavailable(const CudaApi& api) {
  const std::pair<bool, const char*> calls[] = {
      {api.ipc_get_mem_handle != nullptr, "cuIpcGetMemHandle"},
      {api.ipc_open_mem_handle != nullptr, "cuIpcOpenMemHandle_v2"},
      {api.ipc_close_mem_handle != nullptr, "cuIpcCloseMemHandle"},
      {api.mem_get_address_range != nullptr, "cuMemGetAddressRange_v2"},
      {api.memcpy_dtod_async != nullptr, "cuMemcpyDtoDAsync_v2"},
  };
  std::string missing;
  for (const auto& [present, name] : calls) {
    if (!present) missing += (missing.empty() ? "" : ", ") + std::string(name);
  }
  if (missing.empty()) return "";
  return "this NVIDIA driver lacks the CUDA IPC calls " + missing +
         "; upgrade the driver (GPU memory between processes is staged through host memory "
         "until then)";
}

std::string cuda_vmm_ipc_unavailable(const CudaApi& api) {
  const std::pair<bool, const char*> calls[] = {
      {api.mem_retain_allocation_handle != nullptr, "cuMemRetainAllocationHandle"},
      {api.mem_export_to_shareable_handle != nullptr, "cuMemExportToShareableHandle"},
      {api.mem_import_from_shareable_handle != nullptr, "cuMemImportFromShareableHandle"},
      {api.mem_release != nullptr, "cuMemRelease"},
      {api.mem_address_reserve != nullptr, "cuMemAddressReserve"},
      {api.mem_address_free != nullptr, "cuMemAddressFree"},
      {api.mem_map != nullptr, "cuMemMap"},
      {api.mem_unmap != nullptr, "cuMemUnmap"},
      {api.mem_set_access != nullptr, "cuMemSetAccess"},
  };
  std::string missing;
  for (const auto& [present, name] : calls) {
    if (!present) missing += (missing.empty() ? "" : ", ") + std::string(name);
  }
  return missing.empty() ? "" : "this NVIDIA driver lacks the VMM calls " + missing;
}

std::string cuda_error_text(const std::string& op, CUresult result) {
  // The name/string lookups are published by load() before cuInit runs, so cuInit's own
  // failure is reported by name too.
  const char* name = nullptr;
  const char* text = nullptr;
  ErrorTextFn get_name = g_error_name.load();
  ErrorTextFn get_string = g_error_string.load();
  if (get_name != nullptr && get_name(result, &name) != kCudaSuccess) name = nullptr;
  if (get_string != nullptr && get_string(result, &text) != kCudaSuccess) text = nullptr;
  std::string out = op + ": " + (name != nullptr ? name : "CUresult " + std::to_string(result));
  if (text != nullptr) out += std::string(" (") + text + ")";
  return out;
}

void check_cuda(CUresult result, const std::string& op) {
  if (result == kCudaSuccess) return;
  const ErrorKind kind =
      result == kCudaErrorNoDevice ? ErrorKind::kUnsupported : ErrorKind::kTransport;
  throw Error(kind, cuda_error_text(op, result), 0);
}

}  // namespace rdmaxfer
