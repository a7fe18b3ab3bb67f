// The CUDA driver API (libcuda.so.1), loaded at run time.
//
// libcuda.so.1 is opened once with dlopen and its entry points are looked up by name into one
// table of function pointers (like NCCL's cudawrap). Nothing links against libcuda, so the
// package installs, imports and runs on machines without a GPU: cuda_api() then returns nullptr
// with the reason ("no CUDA: libcuda.so.1 not found (...)"), which `rdmaxfer info` prints.
// Versioned exports (_v2) are the ones cuda.h maps the plain names to since CUDA 4/11.
// cuMemGetHandleForAddressRange (CUDA >= 11.7), cuPointerSetAttribute and the CUDA IPC calls
// (the shm transport's device copies: transport/shm/cuda_ipc.h) and cuDeviceCanAccessPeer are
// optional.
#pragma once

#include <string>

#include "cuda/cuda_types.h"

namespace rdmaxfer {

struct CudaApi {
  CUresult (*init)(unsigned) = nullptr;                                        // cuInit
  CUresult (*driver_get_version)(int*) = nullptr;                              // cuDriverGetVersion
  CUresult (*device_get_count)(int*) = nullptr;                                // cuDeviceGetCount
  CUresult (*device_get)(CUdevice*, int) = nullptr;                            // cuDeviceGet
  CUresult (*device_get_name)(char*, int, CUdevice) = nullptr;                 // cuDeviceGetName
  CUresult (*device_get_attribute)(int*, int, CUdevice) = nullptr;             // cuDeviceGetAttribute
  CUresult (*device_get_pci_bus_id)(char*, int, CUdevice) = nullptr;           // cuDeviceGetPCIBusId
  CUresult (*device_total_mem)(size_t*, CUdevice) = nullptr;                   // cuDeviceTotalMem_v2
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;              // cuDevicePrimaryCtxRetain
  CUresult (*primary_ctx_release)(CUdevice) = nullptr;                         // cuDevicePrimaryCtxRelease_v2
  CUresult (*ctx_set_current)(CUcontext) = nullptr;                            // cuCtxSetCurrent
  CUresult (*mem_alloc)(CUdeviceptr*, size_t) = nullptr;                       // cuMemAlloc_v2
  CUresult (*mem_free)(CUdeviceptr) = nullptr;                                 // cuMemFree_v2
  CUresult (*mem_host_alloc)(void**, size_t, unsigned) = nullptr;              // cuMemHostAlloc
  CUresult (*mem_free_host)(void*) = nullptr;                                  // cuMemFreeHost
  CUresult (*memcpy_dtoh_async)(void*, CUdeviceptr, size_t, CUstream) = nullptr;       // _v2
  CUresult (*memcpy_htod_async)(CUdeviceptr, const void*, size_t, CUstream) = nullptr; // _v2
  CUresult (*stream_create)(CUstream*, unsigned) = nullptr;                    // cuStreamCreate
  CUresult (*stream_destroy)(CUstream) = nullptr;                              // cuStreamDestroy_v2
  CUresult (*stream_synchronize)(CUstream) = nullptr;                          // cuStreamSynchronize
  CUresult (*event_create)(CUevent*, unsigned) = nullptr;                      // cuEventCreate
  CUresult (*event_record)(CUevent, CUstream) = nullptr;                       // cuEventRecord
  CUresult (*event_synchronize)(CUevent) = nullptr;                            // cuEventSynchronize
  CUresult (*event_query)(CUevent) = nullptr;                                  // cuEventQuery
  CUresult (*event_destroy)(CUevent) = nullptr;                                // cuEventDestroy_v2
  CUresult (*pointer_get_attribute)(void*, int, CUdeviceptr) = nullptr;        // cuPointerGetAttribute
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;                // cuGetErrorName
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;              // cuGetErrorString
  // Optional (nullptr when this driver lacks them).
  CUresult (*pointer_set_attribute)(const void*, int, CUdeviceptr) = nullptr;  // cuPointerSetAttribute
  CUresult (*mem_get_handle_for_address_range)(void*, CUdeviceptr, size_t, int,
                                               unsigned long long) = nullptr;  // CUDA >= 11.7
  CUresult (*mem_get_address_range)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;  // _v2
  CUresult (*memcpy_dtod_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;  // _v2
  CUresult (*ipc_get_mem_handle)(CUipcMemHandle*, CUdeviceptr) = nullptr;     // cuIpcGetMemHandle
  CUresult (*ipc_open_mem_handle)(CUdeviceptr*, CUipcMemHandle, unsigned) = nullptr;  // _v2
  CUresult (*ipc_close_mem_handle)(CUdeviceptr) = nullptr;                    // cuIpcCloseMemHandle
  CUresult (*device_can_access_peer)(int*, CUdevice, CUdevice) = nullptr;     // cuDeviceCanAccessPeer
  // The VMM calls that share cuMemCreate'd memory between processes (transport/shm/cuda_ipc.h).
  CUresult (*mem_retain_allocation_handle)(CUmemGenericAllocationHandle*, void*) = nullptr;
  CUresult (*mem_export_to_shareable_handle)(void*, CUmemGenericAllocationHandle, int,
                                             unsigned long long) = nullptr;
  CUresult (*mem_import_from_shareable_handle)(CUmemGenericAllocationHandle*, void*,
                                               int) = nullptr;
  CUresult (*mem_release)(CUmemGenericAllocationHandle) = nullptr;            // cuMemRelease
  CUresult (*mem_address_reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                                  unsigned long long) = nullptr;              // cuMemAddressReserve
  CUresult (*mem_address_free)(CUdeviceptr, size_t) = nullptr;               // cuMemAddressFree
  CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                      unsigned long long) = nullptr;                          // cuMemMap
  CUresult (*mem_unmap)(CUdeviceptr, size_t) = nullptr;                       // cuMemUnmap
  CUresult (*mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*,
                             size_t) = nullptr;                               // cuMemSetAccess
};

// "" when `api` offers the VMM calls that share cuMemCreate'd memory between processes
// (cuMemRetainAllocationHandle, cuMemExportToShareableHandle, cuMemImportFromShareableHandle,
// cuMemAddressReserve, cuMemMap, cuMemSetAccess and their releases), else which are missing.
std::string cuda_vmm_ipc_unavailable(const CudaApi& api);

// "" when `api` offers the CUDA IPC calls the shm transport's device copies need
// (transport/shm/cuda_ipc.h), else which are missing and the fix. The one decision the engine,
// `rdmaxfer info` and `rdmaxfer doctor` use (through cuda_status(), cuda/cuda_context.h).
std::string cuda_ipc_unavailable(const CudaApi& api);

// The loaded (and cuInit-ed) table, or nullptr with `why` set ("no CUDA: ..."). Loads once;
// later calls return the same answer. Thread-safe.
const CudaApi* cuda_api(std::string* why);
// The table; throws Error(kUnsupported) with the reason when CUDA cannot be used here.
const CudaApi& cuda();

// "op: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
std::string cuda_error_text(const std::string& op, CUresult result);
// Throws Error(kind) with cuda_error_text when `result` is not CUDA_SUCCESS.
void check_cuda(CUresult result, const std::string& op);

}  // namespace rdmaxfer
