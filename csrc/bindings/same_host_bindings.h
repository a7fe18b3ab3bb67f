// Python bindings of the same-host checks (transport/shm/same_host.h), so tests and `doctor` use
// the very checks the shm handshake runs: _core.host_identity, _core.same_host_mismatch and
// _core.yama_ptrace_scope.
#pragma once

#include <pybind11/pybind11.h>

namespace rdmaxfer {

void bind_same_host(pybind11::module_& m);

}  // namespace rdmaxfer
