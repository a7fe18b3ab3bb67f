#include "bindings/errors.h"

#include "bindings/gil.h"
#include "common/error.h"
#include "common/interrupt.h"

namespace py = pybind11;

namespace rdmaxfer {

const char* error_class_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "InvalidArgumentError";
    case ErrorKind::kConnection: return "ConnectionFailedError";
    case ErrorKind::kTimeout: return "TransferTimeoutError";
    case ErrorKind::kRegistration: return "RegistrationError";
    case ErrorKind::kProtocol: return "ProtocolError";
    case ErrorKind::kRemoteAccess: return "RemoteAccessError";
    case ErrorKind::kUnsupported: return "UnsupportedError";
    case ErrorKind::kTransport: return "TransportError";
    case ErrorKind::kClosed: return "EndpointClosedError";
  }
  return "RdmaxferError";
}

void register_error_translator(py::module_& m) {
  // Imported once; rdmaxfer/__init__.py imports errors before _core.
  // Deliberately never freed: it must outlive every translation, even at interpreter exit.
  static py::object* errors = new py::object(py::module_::import("rdmaxfer.errors"));
  (void)m;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      // The cause travels as attributes too: errno, wc_status (number and name), vendor_err.
      py::object cls = errors->attr(error_class_name(e.kind()));
      py::object exc = cls(e.what());
      exc.attr("errno") = e.err_no() != 0 ? py::object(py::int_(e.err_no())) : py::none();
      const rdmaxfer::CompletionStatus& wc = e.completion();
      if (wc.status >= 0) {
        exc.attr("wc_status") = errors->attr("WcStatus")(wc.status, wc.name);
        exc.attr("vendor_err") = py::int_(wc.vendor_err);
      }
      PyErr_SetObject(cls.ptr(), exc.ptr());
    } catch (const Interrupted&) {
      // python_signal_raised() left the handler's exception (KeyboardInterrupt...) set.
      if (PyErr_Occurred() == nullptr) PyErr_SetNone(PyExc_KeyboardInterrupt);
    }
  });
}

bool python_signal_raised() {
  // An exiting interpreter: the wait ends (its thread then parks, bindings/gil.h).
  if (exiting_elsewhere()) return true;
  // Called inside a GilRelease scope of a Python thread: its thread state is saved.
  PyThreadState* state = PyGILState_GetThisThreadState();
  if (state == nullptr) return false;  // a thread of the core: signals go to the main thread
  take_gil_or_park(state);
  const bool raised = PyErr_CheckSignals() != 0;
  PyEval_SaveThread();
  return raised;
}

}  // namespace rdmaxfer
