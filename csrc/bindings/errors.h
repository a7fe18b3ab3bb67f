// Turns rdmaxfer::Error into the Python classes of rdmaxfer.errors, in one place.
#pragma once

#include <pybind11/pybind11.h>

#include "common/error.h"

namespace rdmaxfer {

// The rdmaxfer.errors class an error of `kind` becomes ("RemoteAccessError"...).
const char* error_class_name(ErrorKind kind);

void register_error_translator(pybind11::module_& m);

// The interrupt check (common/interrupt.h) of calls made from Python: takes the GIL and runs
// Python's signal handlers; true when one raised (e.g. KeyboardInterrupt, left set: the
// translator hands it to Python when the core's Interrupted reaches the bindings).
bool python_signal_raised();

}  // namespace rdmaxfer
