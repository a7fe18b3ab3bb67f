#include "bindings/batch_bindings.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bindings/batch_entries.h"
#include "bindings/errors.h"
#include "bindings/gil.h"
#include "bindings/region_handle.h"
#include "common/error.h"
#include "common/fork_guard.h"
#include "protocol/batch.h"
#include "protocol/connection.h"

namespace py = pybind11;

namespace rdmaxfer {

namespace {

std::optional<NotifyPayload> notify_payload(const py::object& notify) {
  if (notify.is_none()) return std::nullopt;
  NotifyPayload p;
  if (py::isinstance<py::bool_>(notify) || !(py::isinstance<py::int_>(notify) ||
                                             py::isinstance<py::bytes>(notify))) {
    throw Error(ErrorKind::kInvalidArgument,
                "notify=" + std::string(py::str(py::repr(notify))) +
                    " must be bytes (at most 64) or an int in 0..4294967295 (an IMM)");
  }
  if (py::isinstance<py::int_>(notify)) {
    const py::int_ value = notify.cast<py::int_>();
    if (value < py::int_(0) || value > py::int_(0xffffffffULL)) {
      throw Error(ErrorKind::kInvalidArgument,
                  "notify=" + std::string(py::str(value)) +
                      " does not fit an IMM: an int payload must be in 0..4294967295 (32 bits); "
                      "send larger values as bytes");
    }
    p.is_int = true;
    p.value = value.cast<uint32_t>();
    return p;
  }
  p.bytes = notify.cast<std::string>();
  if (p.bytes.size() > NotifyPayload::kMaxBytes) {
    throw Error(ErrorKind::kInvalidArgument,
                "notify= carries " + std::to_string(p.bytes.size()) +
                    " bytes; a notification holds at most 64 (send the rest as data)");
  }
  return p;
}

py::object payload_object(const NotifyPayload& p) {
  if (p.is_int) return py::int_(p.value);
  return py::bytes(p.bytes);
}

// (entry index, rdmaxfer.errors class name, reason) per failed entry.
py::list failure_list(const std::vector<BatchFailure>& failures) {
  py::list out;
  for (const BatchFailure& f : failures) {
    out.append(py::make_tuple(f.entry, error_class_name(f.kind), f.reason));
  }
  return out;
}

std::shared_ptr<BatchPlan> make_plan(const std::string& op,
                                     const std::vector<std::shared_ptr<RegionHandle>>& regions,
                                     const std::vector<Descriptor>& remotes,
                                     const py::array_t<uint64_t, py::array::c_style |
                                                                     py::array::forcecast>& table,
                                     long long chunk_size, int streams) {
  OpKind kind = OpKind::kWrite;
  if (op == "read") {
    kind = OpKind::kRead;
  } else if (op != "write") {
    throw Error(ErrorKind::kInvalidArgument, "BatchPlan: op='" + op + "' must be 'write' or 'read'");
  }
  if (table.ndim() != 2 || table.shape(1) != static_cast<py::ssize_t>(kPlanColumns)) {
    throw Error(ErrorKind::kInvalidArgument, "BatchPlan: the entry table must have shape (N, 5)");
  }
  if (chunk_size < 0 || streams < 0) {
    throw Error(ErrorKind::kInvalidArgument, "BatchPlan: chunk_size and streams must be >= 0");
  }
  std::vector<std::shared_ptr<MemoryRegion>> live;
  live.reserve(regions.size());
  for (const auto& h : regions) live.push_back(live_region(*h));
  TransferOptions options;
  options.chunk_size = static_cast<uint64_t>(chunk_size);
  options.streams = streams;
  // Read in place (C order, forcecast: rows of kPlanColumns words); `table` holds it alive.
  const BatchRows rows{table.data(), static_cast<size_t>(table.shape(0))};
  GilRelease release;
  return std::make_shared<BatchPlan>(kind, std::move(live), remotes, rows, options);
}

}  // namespace

void bind_batches(py::module_& m) {
  bind_batch_entries(m);
  py::class_<BatchPlan, std::shared_ptr<BatchPlan>>(m, "BatchPlan")
      .def(py::init(&make_plan), py::arg("op"), py::arg("regions"), py::arg("remotes"),
           py::arg("table"), py::arg("chunk_size") = 0, py::arg("streams") = 0)
      .def_property_readonly("entries", &BatchPlan::entries)
      .def_property_readonly("operations", [](const BatchPlan& p) { return p.ops().size(); })
      .def_property_readonly("bytes", &BatchPlan::bytes)
      .def_property_readonly("skipped", &BatchPlan::skipped_count)
      .def("invalid", [](const BatchPlan& p) { return failure_list(p.invalid()); });

  py::class_<BatchRun, std::shared_ptr<BatchRun>>(m, "BatchRun")
      .def_property_readonly("request", &BatchRun::request)
      .def_property_readonly("window", &BatchRun::window)
      .def_property_readonly("operations", &BatchRun::operations)
      .def_property_readonly("peak_outstanding", &BatchRun::peak_outstanding)
      .def_property_readonly("notified", &BatchRun::notified)
      .def_property_readonly("bytes_done", &BatchRun::bytes_done)
      .def("failures", [](const BatchRun& r) { return failure_list(r.failures()); });

  m.def(
      "post_batch",
      [](Connection& c, const std::shared_ptr<BatchPlan>& plan, const py::object& notify,
         int window, bool whole) {
        if (inherited(&c)) throw Error(ErrorKind::kClosed, inherited_text("this endpoint"));
        if (window < 1) {
          throw Error(ErrorKind::kInvalidArgument,
                      "window=" + std::to_string(window) + " must be >= 1");
        }
        std::optional<NotifyPayload> payload = notify_payload(notify);
        if (payload && plan->op() != OpKind::kWrite) {
          throw Error(ErrorKind::kInvalidArgument, "notify= goes with WRITEs only, not READs");
        }
        GilRelease release;
        return c.post_batch(plan, std::move(payload), static_cast<uint32_t>(window), whole);
      },
      py::arg("endpoint"), py::arg("plan"), py::arg("notify"),
      py::arg("window") = static_cast<int>(BatchRun::kDefaultWindow), py::arg("whole") = false);

  m.def("check_notify", [](const py::object& notify) { notify_payload(notify); },
        py::arg("notify"));

  m.def(
      "pop_notification",
      [](Engine& e, double timeout_s) -> py::object {
        if (!(timeout_s >= 0) || timeout_s > 1e9) {
          throw Error(ErrorKind::kInvalidArgument,
                      "timeout=" + std::to_string(timeout_s) +
                          " must be a finite number of seconds >= 0");
        }
        NotificationQueue& queue = e.notifications();
        double left = timeout_s;
        for (;;) {
          const double slice = std::min(left, 0.1);
          std::optional<Notification> got;
          {
            GilRelease release;
            got = queue.pop(slice);
          }
          if (got) return py::make_tuple(got->peer, payload_object(got->payload));
          left -= slice;
          if (PyErr_CheckSignals() != 0) throw py::error_already_set();
          if (left <= 0 || e.closed()) return py::none();
        }
      },
      py::arg("engine"), py::arg("timeout"));

  m.def("notification_fd", [](Engine& e) { return e.notifications().fd(); }, py::arg("engine"));
}

}  // namespace rdmaxfer
