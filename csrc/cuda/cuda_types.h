// The few CUDA driver API types and constants rdmaxfer uses, declared here so that the build
// never needs cuda.h (libcuda.so.1 is loaded at run time: cuda_api.h).
//
// Values are those of the CUDA Driver API reference (docs.nvidia.com/cuda/cuda-driver-api,
// "Data types used by CUDA driver" and "Error Handling"); they are part of the driver's stable
// ABI and have not changed since they were introduced.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmaxfer {

using CUresult = int;                   // enum cudaError_enum
using CUdevice = int;                   // typedef int CUdevice_v1
using CUdeviceptr = unsigned long long; // typedef unsigned long long CUdeviceptr_v2 (64-bit)
struct CUctx_st;
struct CUstream_st;
struct CUevent_st;
using CUcontext = CUctx_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;

// CUipcMemHandle: an opaque 64-byte handle to a cuMemAlloc'd allocation (CU_IPC_HANDLE_SIZE).
constexpr size_t kIpcHandleSize = 64;
struct CUipcMemHandle {
  char reserved[kIpcHandleSize];
};

// The VMM API (cuMemCreate/cuMemMap memory, e.g. PyTorch's expandable segments).
using CUmemGenericAllocationHandle = unsigned long long;
struct CUmemLocation {  // CUmemLocation_st
  int type;             // CUmemLocationType
  int id;
};
struct CUmemAccessDesc {  // CUmemAccessDesc_st
  CUmemLocation location;
  int flags;  // CUmemAccess_flags
};
constexpr int kMemHandleTypePosixFd = 0x1;         // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
constexpr int kMemLocationTypeDevice = 0x1;        // CU_MEM_LOCATION_TYPE_DEVICE
constexpr int kMemAccessReadWrite = 0x3;           // CU_MEM_ACCESS_FLAGS_PROT_READWRITE

// CUresult values (cudaError_enum).
constexpr CUresult kCudaSuccess = 0;               // CUDA_SUCCESS
constexpr CUresult kCudaErrorInvalidValue = 1;     // CUDA_ERROR_INVALID_VALUE
constexpr CUresult kCudaErrorNoDevice = 100;       // CUDA_ERROR_NO_DEVICE
constexpr CUresult kCudaErrorNotReady = 600;       // CUDA_ERROR_NOT_READY
constexpr CUresult kCudaErrorNotSupported = 801;   // CUDA_ERROR_NOT_SUPPORTED

// CUdevice_attribute values.
constexpr int kAttrPciBusId = 33;                  // CU_DEVICE_ATTRIBUTE_PCI_BUS_ID
constexpr int kAttrPciDeviceId = 34;               // CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID
constexpr int kAttrUnifiedAddressing = 41;         // CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
constexpr int kAttrPciDomainId = 50;               // CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID
constexpr int kAttrComputeCapabilityMajor = 75;    // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrComputeCapabilityMinor = 76;    // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
constexpr int kAttrGpuDirectRdmaSupported = 116;   // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
constexpr int kAttrDmaBufSupported = 124;          // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED

// CUpointer_attribute values (cuPointerGetAttribute / cuPointerSetAttribute).
constexpr int kPointerAttrMemoryType = 2;          // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerAttrSyncMemops = 6;          // CU_POINTER_ATTRIBUTE_SYNC_MEMOPS
constexpr int kPointerAttrBufferId = 7;            // CU_POINTER_ATTRIBUTE_BUFFER_ID
constexpr int kPointerAttrIsManaged = 8;           // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr int kPointerAttrDeviceOrdinal = 9;       // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL

// CUmemorytype values (what CU_POINTER_ATTRIBUTE_MEMORY_TYPE yields).
constexpr unsigned kMemoryTypeHost = 1;            // CU_MEMORYTYPE_HOST
constexpr unsigned kMemoryTypeDevice = 2;          // CU_MEMORYTYPE_DEVICE
constexpr unsigned kMemoryTypeArray = 3;           // CU_MEMORYTYPE_ARRAY
constexpr unsigned kMemoryTypeUnified = 4;         // CU_MEMORYTYPE_UNIFIED

// Flags.
constexpr unsigned kMemHostAllocPortable = 0x01;   // CU_MEMHOSTALLOC_PORTABLE
constexpr unsigned kStreamNonBlocking = 0x1;       // CU_STREAM_NON_BLOCKING
constexpr unsigned kEventDisableTiming = 0x2;      // CU_EVENT_DISABLE_TIMING
constexpr int kMemRangeHandleTypeDmaBufFd = 0x1;   // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
constexpr unsigned kIpcMemLazyEnablePeerAccess = 0x1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

// The legacy and per-thread default stream handles (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD);
// __cuda_array_interface__ v3 names them 1 and 2 as well.
inline CUstream stream_from_handle(uintptr_t handle) { return reinterpret_cast<CUstream>(handle); }

}  // namespace rdmaxfer
