// The cuFile API of GPUDirect Storage (libcufile.so.0), loaded at run time like libcuda
// (cuda/cuda_api.h): one table of function pointers, looked up by name once. Nothing links
// against libcufile, so the package runs where it is absent: cufile_api() then returns nullptr
// with the reason, and loads read through host bounce buffers instead.
//
// RDMAXFER_CUFILE_LIBRARY overrides the library (the tests' stand-in, tests/cuda_standin).
// The declarations follow cufile.h (CUDA 11.4+): CUfileError_t is {CUfileOpError, CUresult},
// CUfileDescr_t {type, {fd | handle}, fs_ops}. The driver, opened on first use, stays open for
// the process's life (libcufile closes it at exit).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace rdmaxfer {

struct CUfileError {
  int err;     // CUfileOpError: 0 is CU_FILE_SUCCESS
  int cu_err;  // CUresult when err is CU_FILE_CUDA_DRIVER_ERROR
};

struct CUfileDescr {
  int type;  // CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};

struct CufileApi {
  CUfileError (*driver_open)() = nullptr;                                   // cuFileDriverOpen
  CUfileError (*handle_register)(void**, CUfileDescr*) = nullptr;           // cuFileHandleRegister
  void (*handle_deregister)(void*) = nullptr;                               // cuFileHandleDeregister
  CUfileError (*buf_register)(const void*, size_t, int) = nullptr;          // cuFileBufRegister
  CUfileError (*buf_deregister)(const void*) = nullptr;                     // cuFileBufDeregister
  ssize_t (*read)(void*, void*, size_t, off_t, off_t) = nullptr;            // cuFileRead
};

// The loaded table with the driver opened (cuFileDriverOpen, once), or nullptr with `why`
// set ("no GPUDirect Storage: ..."). Thread-safe; later calls return the same answer.
const CufileApi* cufile_api(std::string* why);

// What loading libcufile found, for `rdmaxfer info` and `doctor`: the name tried
// (RDMAXFER_CUFILE_LIBRARY or libcufile.so.0), the file it loaded from ("" when dlopen
// failed), its version ("" when unknown: cuFileGetVersion, where the library has it, else the
// version in the file's name), and why GDS cannot be used ("" when it can). Loads the library
// and opens the driver as cufile_api() does (once).
struct CufileStatus {
  std::string library;
  std::string path;
  std::string version;
  std::string unavailable;
};
CufileStatus cufile_status();

// "op: cuFile error N (CU_FILE_NAME)" (with the CUresult when the error is a CUDA driver error).
std::string cufile_error_text(const std::string& op, const CUfileError& e);

}  // namespace rdmaxfer
