// Python arguments and results shared by the class bindings (module.cc, endpoint_bindings.cc):
// timeouts and sizes checked into the core's types (Error(kInvalidArgument) naming the value),
// and counters as a dict.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "core/stats.h"

namespace rdmaxfer {

// `timeout_s` if it is a finite number of seconds >= 0; `what` names the call.
double checked_timeout(double timeout_s, const char* what);

// `value` as a size if it is >= 0; `what` names the argument.
uint64_t checked_size(long long value, const char* what);

// Counters (core/stats.h) as a dict of str -> int.
pybind11::dict stats_dict(const Stats& stats);

}  // namespace rdmaxfer
