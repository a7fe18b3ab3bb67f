#include "bindings/endpoint_bindings.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "bindings/conversions.h"
#include "bindings/gil.h"
#include "bindings/log_bridge.h"
#include "bindings/region_handle.h"
#include "common/error.h"
#include "common/fork_guard.h"
#include "core/request.h"
#include "engine/engine.h"
#include "engine/timed_loop.h"
#include "protocol/connection.h"

namespace py = pybind11;

namespace rdmaxfer {

namespace {

TransferOptions transfer_options(long long chunk_size, int streams) {
  TransferOptions o;
  o.chunk_size = checked_size(chunk_size, "chunk_size");
  if (streams < 0) throw Error(ErrorKind::kInvalidArgument, "streams must be >= 0");
  o.streams = streams;
  return o;
}

// Short transfers usually finish within this many microseconds; waiting callers spin that long
// (yielding the CPU) before sleeping on the request's condition variable.
constexpr int kSpinUs = 50;

using Clock = std::chrono::steady_clock;

// Waits for `req` until `deadline` in slices of at most 0.1 s, the GIL released (spinning
// kSpinUs first when `spin`), running Python's signal handlers between slices so that Ctrl-C
// reaches Python (what a handler raises propagates). True when the request is terminal.
bool wait_slices(const Request& req, Clock::time_point deadline, bool spin) {
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    bool done = false;
    {
      GilRelease release;
      done = req.wait_for(std::max(0.0, std::min(left, 0.1)), spin ? kSpinUs : 0);
      spin = false;
    }
    if (done) return true;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (left <= 0.1) return req.done();
  }
}

Clock::time_point deadline_in(double timeout_s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(timeout_s));
}

bool wait_request(const Request& req, double timeout_s) {
  checked_timeout(timeout_s, "wait");
  return wait_slices(req, deadline_in(timeout_s), true);
}

// A blocking operation in one call (the lean path of rdmaxfer/transport/blocking.py): posts with
// `post` (GIL released) and waits up to `wait_s` seconds as Request.wait does, the post and the
// first wait slice under one release of the GIL. True when the request completed: then no
// Request reaches Python. Otherwise the request goes into slot[0] (a list of one item the
// caller made) before this returns False (failed, or still
// pending at the bound: wait_s <= 0 does not wait) or raises what a signal handler raised
// (Ctrl-C) while it waited; a request that could not be posted raises with slot untouched.
template <typename Post>
bool post_and_wait(Post post, double wait_s, const py::list& slot) {
  if (slot.size() != 1) {
    throw Error(ErrorKind::kInvalidArgument, "post_*_wait: slot must be a list of one item");
  }
  const bool waits = wait_s > 0;  // NaN does not wait
  wait_s = waits ? std::min(wait_s, 1e9) : 0.0;
  const Clock::time_point deadline = deadline_in(wait_s);
  RequestPtr req;
  bool done = false;
  {
    GilRelease release;
    req = post();
    if (waits) done = req->wait_for(std::min(wait_s, 0.1), kSpinUs);
  }
  if (done && req->state() == Request::State::kDone) return true;
  slot[0] = py::cast(req);
  if (!done && waits) {
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (wait_s > 0.1) done = wait_slices(*req, deadline, false);
  }
  return done && req->state() == Request::State::kDone;
}

// An endpoint inherited through fork() is inert (common/fork_guard.h).
void own(const Connection& c) {
  if (rdmaxfer::inherited(&c)) throw Error(ErrorKind::kClosed, rdmaxfer::inherited_text("this endpoint"));
}

}  // namespace

void bind_endpoints(py::module_& m) {
  py::class_<Request, RequestPtr>(m, "Request")
      .def_property_readonly("id", &Request::id)
      .def_property_readonly("op", [](const Request& r) { return rdmaxfer::op_kind_name(r.op()); })
      .def_property_readonly("bytes", &Request::bytes)
      .def_property_readonly("moved", &Request::moved_bytes)
      .def("idle", &Request::idle_s)
      .def("done", &Request::done)
      .def("failed", [](const Request& r) { return r.state() == Request::State::kFailed; })
      .def("wait", &wait_request, py::arg("timeout"))
      .def("check", &Request::rethrow)
      .def("message",
           [](const Request& r) {
             auto info = r.message();
             return py::make_tuple(info.msg_id, info.length, py::bytes(info.meta));
           })
      .def("watch", [](Request& r, Engine& e) { r.watch(e.notifier()); }, py::arg("engine"));

  auto region_of = [](const std::shared_ptr<RegionHandle>& h) {
    return rdmaxfer::live_region(*h);
  };

  // post_write / post_read: the one-sided `post` (Connection::post_write or post_read), the GIL
  // released while it posts.
  auto one_sided_post = [region_of](auto post) {
    return [region_of, post](Connection& c, const std::shared_ptr<RegionHandle>& local,
                             long long local_offset, const Descriptor& remote,
                             long long remote_offset, long long length, long long chunk_size,
                             int streams) {
      own(c);
      auto region = region_of(local);
      auto opts = transfer_options(chunk_size, streams);
      GilRelease release;
      return (c.*post)(region, checked_size(local_offset, "local_offset"), remote,
                       checked_size(remote_offset, "remote_offset"),
                       checked_size(length, "length"), opts);
    };
  };

  // post_write_wait / post_read_wait: the one-sided `post` (Connection::post_write or
  // post_read) and its wait in one call, with one release of the GIL (post_and_wait).
  auto one_sided_wait = [region_of](auto post) {
    return [region_of, post](Connection& c, const std::shared_ptr<RegionHandle>& local,
                             long long local_offset, const Descriptor& remote,
                             long long remote_offset, long long length, long long chunk_size,
                             int streams, double wait_s, const py::list& slot) {
      own(c);
      auto region = region_of(local);
      auto opts = transfer_options(chunk_size, streams);
      return post_and_wait(
          [&] {
            return (c.*post)(region, checked_size(local_offset, "local_offset"), remote,
                             checked_size(remote_offset, "remote_offset"),
                             checked_size(length, "length"), opts);
          },
          wait_s, slot);
    };
  };
  py::class_<Connection, std::shared_ptr<Connection>>(m, "Endpoint")
      .def_property_readonly("peer", &Connection::peer)
      .def_property_readonly("streams", &Connection::streams)
      .def_property_readonly("closed", &Connection::is_closed)
      .def_property_readonly("error", &Connection::error)
      .def("describe", &Connection::describe)
      .def_property_readonly("transport", &Connection::transport)
      .def_property_readonly("transport_note", &Connection::transport_note)
      .def("stats", [](const Connection& c) { return stats_dict(c.stats()); })
      .def("attributes",
           [](const Connection& c) {
             py::dict d;
             for (const auto& [name, value] : c.attributes()) d[py::str(name)] = value;
             for (const auto& [name, value] : c.names()) d[py::str(name)] = value;
             return d;
           })
      .def("post_write", one_sided_post(&Connection::post_write), py::arg("local"),
           py::arg("local_offset"), py::arg("remote"), py::arg("remote_offset"),
           py::arg("length"), py::arg("chunk_size") = 0, py::arg("streams") = 0)
      .def("post_read", one_sided_post(&Connection::post_read), py::arg("local"),
           py::arg("local_offset"), py::arg("remote"), py::arg("remote_offset"),
           py::arg("length"), py::arg("chunk_size") = 0, py::arg("streams") = 0)
      .def(
          "post_send",
          [region_of](Connection& c, const std::shared_ptr<RegionHandle>& local, long long offset,
                      long long length, const py::bytes& meta, long long chunk_size,
                      int streams) {
            own(c);
            auto region = region_of(local);
            auto opts = transfer_options(chunk_size, streams);
            std::string meta_s = meta;
            GilRelease release;
            return c.post_send(region, checked_size(offset, "offset"),
                               checked_size(length, "length"), meta_s, opts);
          },
          py::arg("local"), py::arg("offset"), py::arg("length"), py::arg("meta"),
          py::arg("chunk_size") = 0, py::arg("streams") = 0)
      .def("post_write_wait", one_sided_wait(&Connection::post_write), py::arg("local"),
           py::arg("local_offset"), py::arg("remote"), py::arg("remote_offset"), py::arg("length"),
           py::arg("chunk_size"), py::arg("streams"), py::arg("wait"), py::arg("slot"))
      .def("post_read_wait", one_sided_wait(&Connection::post_read), py::arg("local"),
           py::arg("local_offset"), py::arg("remote"), py::arg("remote_offset"), py::arg("length"),
           py::arg("chunk_size"), py::arg("streams"), py::arg("wait"), py::arg("slot"))
      .def(
          "post_send_wait",
          [region_of](Connection& c, const std::shared_ptr<RegionHandle>& local, long long offset,
                      long long length, const py::bytes& meta, long long chunk_size, int streams,
                      double wait_s, const py::list& slot) {
            own(c);
            auto region = region_of(local);
            auto opts = transfer_options(chunk_size, streams);
            std::string meta_s = meta;
            return post_and_wait(
                [&] {
                  return c.post_send(region, checked_size(offset, "offset"),
                                     checked_size(length, "length"), meta_s, opts);
                },
                wait_s, slot);
          },
          py::arg("local"), py::arg("offset"), py::arg("length"), py::arg("meta"),
          py::arg("chunk_size"), py::arg("streams"), py::arg("wait"), py::arg("slot"))
      .def("post_recv_header",
           [](Connection& c) {
             own(c);
             return c.post_recv_header();
           })
      .def(
          "post_recv",
          [region_of](Connection& c, uint64_t msg_id, const std::shared_ptr<RegionHandle>& local,
                      long long offset, long long length) {
            own(c);
            auto region = region_of(local);
            GilRelease release;
            return c.post_recv(msg_id, region, checked_size(offset, "offset"),
                               checked_size(length, "length"));
          },
          py::arg("msg_id"), py::arg("local"), py::arg("offset"), py::arg("length"))
      .def(
          "reject",
          [](Connection& c, uint64_t msg_id, const std::string& reason) {
            own(c);
            c.reject(msg_id, reason);
          },
          py::arg("msg_id"), py::arg("reason"))
      .def(
          "cancel_recv_header",
          [](Connection& c, const RequestPtr& request) {
            own(c);
            return c.cancel_recv_header(request);
          },
          py::arg("request"))
      .def("close",
           [](Connection& c) {
             if (rdmaxfer::inherited(&c)) return;  // inherited: the parent's, left alone
             rdmaxfer::refresh_log_level();
             GilRelease release;
             c.close();
           })
      .def("begin_close",
           [](Connection& c) {
             if (rdmaxfer::inherited(&c)) return;
             rdmaxfer::refresh_log_level();
             GilRelease release;
             c.begin_close();
           })
      .def(
          "abort",
          [](Connection& c, const std::string& reason, bool timed_out) {
            if (rdmaxfer::inherited(&c)) return;
            c.abort(timed_out ? ErrorKind::kTimeout : ErrorKind::kConnection, reason);
          },
          py::arg("reason"), py::arg("timed_out") = false,
          py::call_guard<GilRelease>())
      .def(
          "timed_loop",
          [region_of](Connection& c, const std::string& op,
                      const std::shared_ptr<RegionHandle>& local, long long local_offset,
                      const Descriptor& remote, long long remote_offset, long long length,
                      long long iters, long long warmup, int inflight, double timeout) {
            rdmaxfer::TimedLoopSpec s;
            if (op == "write") {
              s.op = rdmaxfer::OpKind::kWrite;
            } else if (op == "read") {
              s.op = rdmaxfer::OpKind::kRead;
            } else {
              throw Error(ErrorKind::kInvalidArgument,
                          "timed_loop: op='" + op + "' must be 'write' or 'read'");
            }
            if (inflight < 1) {
              throw Error(ErrorKind::kInvalidArgument, "timed_loop: inflight must be >= 1");
            }
            own(c);
            s.local = region_of(local);
            s.local_offset = checked_size(local_offset, "local_offset");
            s.remote = remote;
            s.remote_offset = checked_size(remote_offset, "remote_offset");
            s.length = checked_size(length, "length");
            s.iters = checked_size(iters, "iters");
            s.warmup = checked_size(warmup, "warmup");
            s.inflight = static_cast<uint32_t>(inflight);
            s.timeout_s = checked_timeout(timeout, "timed_loop");
            GilRelease release;
            return rdmaxfer::timed_loop(c, s);
          },
          py::arg("op"), py::arg("local"), py::arg("local_offset"), py::arg("remote"),
          py::arg("remote_offset"), py::arg("length"), py::arg("iters"), py::arg("warmup"),
          py::arg("inflight"), py::arg("timeout") = 60.0);
}

}  // namespace rdmaxfer
