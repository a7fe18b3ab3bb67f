// Python bindings of requests and endpoints (core/request.h, protocol/connection.h):
// _core.Request (wait, check, the received message) and _core.Endpoint (one-sided and message
// operations, the blocking post_*_wait forms, close, abort, timed_loop). Blocking calls release
// the GIL and run Python's signal handlers between wait slices.
#pragma once

#include <pybind11/pybind11.h>

namespace rdmaxfer {

void bind_endpoints(pybind11::module_& m);

}  // namespace rdmaxfer
