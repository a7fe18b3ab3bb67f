#include "bindings/log_bridge.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "bindings/gil.h"
#include "common/log.h"

namespace py = pybind11;

namespace rdmaxfer {

namespace {

constexpr int kNothing = 100;  // above every level: the core builds no message
// How long closing the bridge waits for messages on their way into Python.
constexpr auto kCloseWait = std::chrono::seconds(2);

// Open from install until the atexit hook; a thread counts itself in g_active before it looks
// at g_open, and the hook clears g_open before it waits for g_active to reach 0 (both
// sequentially consistent), so no thread asks for the GIL once the interpreter finalizes.
std::atomic<bool> g_open{false};
std::atomic<int> g_active{0};
// logging.getLogger("rdmaxfer"); never freed (the interpreter may be gone by then).
PyObject* g_logger = nullptr;

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

void python_sink(log::Level level, const std::string& message) {
  g_active.fetch_add(1);
  if (g_open.load() && !finalizing()) {
    py::gil_scoped_acquire gil;
    PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()),
                                          "replace");
    PyObject* result = text == nullptr ? nullptr
                                       : PyObject_CallMethod(g_logger, "log", "iO",
                                                             static_cast<int>(level), text);
    // logging reports its handlers' errors itself (Handler.handleError); a failure here (out
    // of memory) must not surface on an unrelated thread.
    if (result == nullptr) PyErr_Clear();
    Py_XDECREF(result);
    Py_XDECREF(text);
  }
  g_active.fetch_sub(1);
}

void close_bridge() {
  g_open.store(false);
  log::set_sink(nullptr, kNothing);
  GilRelease release;  // messages already asking for the GIL get it and finish
  const auto until = std::chrono::steady_clock::now() + kCloseWait;
  while (g_active.load() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

void refresh_log_level() {
  if (!g_open.load()) return;
  int threshold = kNothing;
  for (log::Level level : {log::Level::kDebug, log::Level::kInfo, log::Level::kWarning,
                           log::Level::kError}) {
    const py::object enabled = py::reinterpret_borrow<py::object>(g_logger).attr("isEnabledFor")(
        static_cast<int>(level));
    if (enabled.cast<bool>()) {
      threshold = static_cast<int>(level);
      break;
    }
  }
  log::set_threshold(threshold);
}

void install_log_bridge(py::module_& m) {
  py::module_ logging = py::module_::import("logging");
  py::object logger = logging.attr("getLogger")("rdmaxfer");
  logger.attr("addHandler")(logging.attr("NullHandler")());
  g_logger = logger.release().ptr();
  g_open.store(true);
  log::set_sink(&python_sink, kNothing);
  refresh_log_level();
  py::module_::import("atexit").attr("register")(py::cpp_function(&close_bridge));
  m.def("refresh_log_level", &refresh_log_level,
        "Re-reads the 'rdmaxfer' logger's effective level into the C++ core (it is also re-read "
        "at every Engine, connect and accept).");
}

}  // namespace rdmaxfer
