// Turns rdmaxfer::Error into the Python classes of rdmaxfer.errors, in one place.
#pragma once

#include <pybind11/pybind11.h>

namespace rdmaxfer {

void register_error_translator(pybind11::module_& m);

}  // namespace rdmaxfer
