// Python bindings of the ofi transport's provider decisions (transport/ofi/ofi_settings.h), so
// that `doctor` reports what the transport would decide and tests check the decisions against
// any provider's fi_info: _core.ofi_providers and _core.ofi_decide_settings.
#pragma once

#include <pybind11/pybind11.h>

namespace rdmaxfer {

void bind_ofi(pybind11::module_& m);

}  // namespace rdmaxfer
