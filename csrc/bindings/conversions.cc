#include "bindings/conversions.h"

#include <string>

#include "common/error.h"

namespace py = pybind11;

namespace rdmaxfer {

double checked_timeout(double timeout_s, const char* what) {
  if (!(timeout_s >= 0) || timeout_s > 1e9) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + ": timeout=" + std::to_string(timeout_s) +
                    " must be a finite number of seconds >= 0");
  }
  return timeout_s;
}

uint64_t checked_size(long long value, const char* what) {
  if (value < 0) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + "=" + std::to_string(value) + " must be >= 0");
  }
  return static_cast<uint64_t>(value);
}

py::dict stats_dict(const rdmaxfer::Stats& stats) {
  py::dict d;
  for (const auto& [name, value] : stats.snapshot()) d[py::str(name)] = value;
  return d;
}

}  // namespace rdmaxfer
