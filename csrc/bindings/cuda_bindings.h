// Python bindings of csrc/cuda (class definitions only): the CUDA status, device memory,
// copiers, the staging pipeline and the DLPack export of device memory.
#pragma once

#include <pybind11/pybind11.h>

namespace rdmaxfer {

void bind_cuda(pybind11::module_& m);

}  // namespace rdmaxfer
