// Python bindings of csrc/transport/storage: reading byte ranges of a local file into host or
// device memory (rdmaxfer.weights.loading drives it).
#pragma once

#include <pybind11/pybind11.h>

namespace rdmaxfer {

void bind_storage(pybind11::module_& m);

}  // namespace rdmaxfer
