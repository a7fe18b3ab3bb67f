// Bridges the C++ log sink (common/log.h) to Python's logging: every message becomes a record
// of the logger "rdmaxfer" (which has a NullHandler: silent unless the user configures logging).
#pragma once

#include <pybind11/pybind11.h>

namespace rdmaxfer {

// Installs the sink and an atexit hook that closes the bridge before the interpreter finalizes
// (later messages are dropped). Called once, at import.
void install_log_bridge(pybind11::module_& m);

// Re-reads the logger's effective level into the core's threshold, so that the core builds no
// message that logging would drop. GIL held; called where connections are made (rare).
void refresh_log_level();

}  // namespace rdmaxfer
