// Python bindings: class definitions only. Blocking calls release the GIL; errors become
// Python exceptions in bindings/errors.cc.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>

#include "bindings/batch_bindings.h"
#include "bindings/same_host_bindings.h"
#include "bindings/cuda_bindings.h"
#include "bindings/storage_bindings.h"
#include "bindings/errors.h"
#include "bindings/gil.h"
#include "bindings/log_bridge.h"
#include "bindings/region_handle.h"
#include "common/error.h"
#include "common/fork_guard.h"
#include "common/interrupt.h"
#include "core/region.h"
#include "engine/engine.h"
#include "engine/timed_loop.h"
#include "protocol/connection.h"
#include "transport/gpu_registration.h"
#include "transport/records.h"

namespace py = pybind11;
using rdmaxfer::Connection;
using rdmaxfer::Descriptor;
using rdmaxfer::Engine;
using rdmaxfer::Error;
using rdmaxfer::GilRelease;
using rdmaxfer::ErrorKind;
using rdmaxfer::MemoryRegion;
using rdmaxfer::RegionHandle;
using rdmaxfer::Request;
using rdmaxfer::RequestPtr;
using rdmaxfer::TransferOptions;

namespace {

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

// Endpoints and regions handed to Python are kept alive (never acted on) in a child of fork().
template <typename T>
std::shared_ptr<T> kept_in_child(std::shared_ptr<T> obj) {
  rdmaxfer::keep_in_child(obj);
  return obj;
}

// The endpoint of a connection the engine's wireup made, naming its transport.
std::shared_ptr<Connection> linked(rdmaxfer::Link link) {
  auto c = std::make_shared<Connection>(std::move(link.channel));
  c->set_transport(std::move(link.transport), std::move(link.note));
  return c;
}

// Counters (core/stats.h) as a dict of str -> int.
py::dict stats_dict(const rdmaxfer::Stats& stats) {
  py::dict d;
  for (const auto& [name, value] : stats.snapshot()) d[py::str(name)] = value;
  return d;
}

// Destroys an Engine without the GIL: its shutdown joins I/O threads that may be waiting for the
// GIL to log (bindings/log_bridge.h).
struct ReleaseGilDelete {
  void operator()(Engine* engine) const {
    GilRelease release;
    delete engine;
  }
};
using EnginePtr = std::unique_ptr<Engine, ReleaseGilDelete>;

Descriptor unpack_descriptor(const py::bytes& data) {
  std::string_view view = data;
  return Descriptor::unpack(reinterpret_cast<const uint8_t*>(view.data()), view.size());
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "rdmaxfer C++ core (see python/rdmaxfer/_core.pyi)";
  rdmaxfer::register_error_translator(m);
  rdmaxfer::install_log_bridge(m);

  m.attr("ACCESS_LOCAL") = static_cast<uint32_t>(rdmaxfer::kAccessLocal);
  m.attr("ACCESS_REMOTE_READ") = static_cast<uint32_t>(rdmaxfer::kAccessRemoteRead);
  m.attr("ACCESS_REMOTE_WRITE") = static_cast<uint32_t>(rdmaxfer::kAccessRemoteWrite);
  m.attr("ACCESS_LOCAL_WRITE") = static_cast<uint32_t>(rdmaxfer::kAccessLocalWrite);
  m.def("available_transports", &rdmaxfer::available_transports);
  m.def("memlock_limit", &rdmaxfer::memlock_limit_text);
  m.def("begin_exit", &rdmaxfer::begin_exit,
        "Marks the interpreter as exiting (the package's atexit hook, before it closes the "
        "engines): from now on other threads never take the GIL back from a core call.");
  // The address of a C-contiguous buffer's first byte (what numpy's __array_interface__ gives,
  // without building that dict on every transfer).
  m.def(
      "address_of",
      [](const py::object& obj) {
        Py_buffer view;
        if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_ANY_CONTIGUOUS) != 0) {
          throw py::error_already_set();
        }
        const auto addr = reinterpret_cast<uintptr_t>(view.buf);
        PyBuffer_Release(&view);
        return static_cast<uint64_t>(addr);
      },
      py::arg("obj"));
  m.def("record_kinds", &rdmaxfer::record_kinds);
  m.def(
      "parse_record",
      [](const std::string& kind, const py::bytes& data) {
        std::string_view view = data;
        return rdmaxfer::parse_record(kind, reinterpret_cast<const uint8_t*>(view.data()),
                                      view.size());
      },
      py::arg("kind"), py::arg("data"));

  py::class_<Descriptor>(m, "Descriptor")
      .def_readonly_static("SIZE", &Descriptor::kSize)
      .def_property_readonly("transport",
                             [](const Descriptor& d) {
                               return std::string(rdmaxfer::transport_kind_name(d.transport));
                             })
      .def_readonly("access", &Descriptor::access)
      .def_readonly("addr", &Descriptor::addr)
      .def_readonly("length", &Descriptor::length)
      .def_readonly("key", &Descriptor::key)
      .def_readonly("rail_keys", &Descriptor::rail_keys)
      .def_readonly("engine_id", &Descriptor::engine_id)
      .def("pack", [](const Descriptor& d) { return py::bytes(d.pack()); })
      .def_static("unpack", &unpack_descriptor, py::arg("data"))
      .def("__eq__", [](const Descriptor& a, const Descriptor& b) { return a.pack() == b.pack(); })
      .def("__repr__", [](const Descriptor& d) {
        return "Descriptor(transport=" + std::string(rdmaxfer::transport_kind_name(d.transport)) +
               ", addr=0x" + py::str(py::int_(d.addr).attr("__format__")("x")).cast<std::string>() +
               ", length=" + std::to_string(d.length) + ", key=" + std::to_string(d.key) +
               ", access=" + std::to_string(d.access) + ")";
      });

  py::class_<RegionHandle, std::shared_ptr<RegionHandle>>(m, "Region", py::buffer_protocol())
      .def_buffer([](RegionHandle& h) {
        return py::buffer_info(h.region->addr(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(h.region->length())}, {1}, false);
      })
      .def_property_readonly("addr",
                             [](const RegionHandle& h) {
                               return reinterpret_cast<uint64_t>(h.region->addr());
                             })
      .def_property_readonly("length", [](const RegionHandle& h) { return h.region->length(); })
      .def_property_readonly("key", [](const RegionHandle& h) { return h.region->key(); })
      .def_property_readonly("access",
                             [](const RegionHandle& h) {
                               return h.region->access() & rdmaxfer::kAccessRemoteMask;
                             })
      .def_property_readonly("local_write",
                             [](const RegionHandle& h) { return h.region->local_write(); })
      .def_property_readonly("pinned", [](const RegionHandle& h) { return h.region->pinned(); })
      .def_property_readonly("registered", [](const RegionHandle& h) { return h.registered; })
      .def_property("home_rail", [](const RegionHandle& h) { return h.region->home_rail(); },
                    [](RegionHandle& h, int rail) { h.region->set_home_rail(rail); })
      .def("descriptor", [](const RegionHandle& h) {
        return h.engine->transport().describe_region(*h.region);
      });

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
             return d;
           })
      .def(
          "post_write",
          [region_of](Connection& c, const std::shared_ptr<RegionHandle>& local,
                      long long local_offset, const Descriptor& remote, long long remote_offset,
                      long long length, long long chunk_size, int streams) {
            own(c);
            auto region = region_of(local);
            auto opts = transfer_options(chunk_size, streams);
            GilRelease release;
            return c.post_write(region, checked_size(local_offset, "local_offset"), remote,
                                checked_size(remote_offset, "remote_offset"),
                                checked_size(length, "length"), opts);
          },
          py::arg("local"), py::arg("local_offset"), py::arg("remote"), py::arg("remote_offset"),
          py::arg("length"), py::arg("chunk_size") = 0, py::arg("streams") = 0)
      .def(
          "post_read",
          [region_of](Connection& c, const std::shared_ptr<RegionHandle>& local,
                      long long local_offset, const Descriptor& remote, long long remote_offset,
                      long long length, long long chunk_size, int streams) {
            own(c);
            auto region = region_of(local);
            auto opts = transfer_options(chunk_size, streams);
            GilRelease release;
            return c.post_read(region, checked_size(local_offset, "local_offset"), remote,
                               checked_size(remote_offset, "remote_offset"),
                               checked_size(length, "length"), opts);
          },
          py::arg("local"), py::arg("local_offset"), py::arg("remote"), py::arg("remote_offset"),
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

  py::class_<Engine, EnginePtr>(m, "Engine")
      .def(py::init([](const std::string& transport, int io_threads, int socket_buffer,
                       int default_streams, const std::string& rdma_device, int gid_index,
                       const std::string& poll_mode, const std::string& secret,
                       const std::vector<std::string>& rdma_devices, int service_level,
                       int traffic_class, int min_rnr_timer) {
             if (io_threads < 0 || io_threads > 64) {
               throw Error(ErrorKind::kInvalidArgument,
                           "io_threads=" + std::to_string(io_threads) + " must be in 0..64");
             }
             if (socket_buffer < 0) {
               throw Error(ErrorKind::kInvalidArgument, "socket_buffer must be >= 0 bytes");
             }
             if (default_streams < 0) {
               throw Error(ErrorKind::kInvalidArgument, "streams must be >= 0");
             }
             rdmaxfer::TransportConfig config;
             config.tcp.io_threads = io_threads;
             config.tcp.socket_buffer = socket_buffer;
             config.tcp.default_streams = default_streams;
             if (gid_index < -1 || gid_index > 65535) {
               throw Error(ErrorKind::kInvalidArgument,
                           "gid_index=" + std::to_string(gid_index) +
                               " must be -1 (auto) or a GID table index");
             }
             config.rdma.device = rdma_device;
             config.rdma.devices = rdma_devices;
             config.rdma.gid_index = gid_index;
             config.rdma.poll_mode = poll_mode;
             config.tcp.secret = secret;
             config.rdma.secret = secret;
             config.rdma.default_qps = default_streams;
             config.rdma.service_level = service_level;  // checked by the rdma transport
             config.rdma.traffic_class = traffic_class;
             config.rdma.min_rnr_timer = min_rnr_timer;
             rdmaxfer::refresh_log_level();
             GilRelease release;
             return EnginePtr(new Engine(transport, config));
           }),
           py::arg("transport") = "tcp", py::arg("io_threads") = 0, py::arg("socket_buffer") = 0,
           py::arg("default_streams") = 0, py::arg("rdma_device") = "",
           py::arg("gid_index") = -1, py::arg("poll_mode") = "", py::arg("secret") = "",
           py::arg("rdma_devices") = std::vector<std::string>{}, py::arg("service_level") = -1,
           py::arg("traffic_class") = -1, py::arg("min_rnr_timer") = -1)
      .def_property_readonly("transport", &Engine::transport_name)
      .def_property_readonly("automatic", &Engine::automatic)
      .def_property_readonly("has_shm_companion", &Engine::has_shm_companion)
      .def_property_readonly("shm_off", [](Engine& e) { return e.wireup().shm_off(); })
      .def_property_readonly("engine_id", &Engine::engine_id)
      .def_property_readonly("notify_fd", [](const Engine& e) { return e.notifier()->fd(); })
      .def("capabilities",
           [](Engine& e) {
             auto caps = e.transport().capabilities();
             py::dict d;
             d["transport"] = rdmaxfer::transport_kind_name(caps.kind);
             d["one_sided"] = caps.one_sided;
             d["write_with_imm"] = caps.write_with_imm;
             d["gpu_direct"] = caps.gpu_direct;
             d["max_message"] = caps.max_message;
             return d;
           })
      .def("describe", [](Engine& e) { return e.transport().describe(); })
      .def("rails", [](Engine& e) { return e.transport().rails(); })
      .def("stats",
           [](const Engine& e) {
             py::dict d = stats_dict(e.stats());
             for (const auto& [name, value] : e.gauges()) d[py::str(name)] = value;
             return d;
           })
      .def(
          "listen",
          [](Engine& e, const std::string& host, int port) {
            if (port < 0 || port > 65535) {
              throw Error(ErrorKind::kInvalidArgument,
                          "port=" + std::to_string(port) + " must be in 0..65535");
            }
            return e.wireup().listen(host, static_cast<uint16_t>(port));
          },
          py::arg("host"), py::arg("port"))
      .def(
          "accept",
          [](Engine& e, double timeout) {
            checked_timeout(timeout, "accept");
            auto& w = e.wireup();
            rdmaxfer::refresh_log_level();
            rdmaxfer::InterruptScope ctrl_c(&rdmaxfer::python_signal_raised);
            GilRelease release;
            return kept_in_child(linked(w.accept(timeout)));
          },
          py::arg("timeout"), py::keep_alive<0, 1>())
      .def(
          "connect",
          [](Engine& e, const std::string& host, int port, int streams, double timeout,
             bool retry_refused) {
            checked_timeout(timeout, "connect");
            if (port <= 0 || port > 65535) {
              throw Error(ErrorKind::kInvalidArgument,
                          "port=" + std::to_string(port) + " must be in 1..65535");
            }
            if (streams < 0) throw Error(ErrorKind::kInvalidArgument, "streams must be >= 0");
            auto& w = e.wireup();
            rdmaxfer::refresh_log_level();
            rdmaxfer::ConnectOptions o;
            o.streams = streams;
            o.timeout_s = timeout;
            o.retry_refused = retry_refused;
            rdmaxfer::InterruptScope ctrl_c(&rdmaxfer::python_signal_raised);
            GilRelease release;
            return kept_in_child(linked(w.connect(host, static_cast<uint16_t>(port), o)));
          },
          py::arg("host"), py::arg("port"), py::arg("streams"), py::arg("timeout"),
          py::arg("retry_refused") = true, py::keep_alive<0, 1>())
      .def(
          "register",
          [](Engine& e, uint64_t addr, long long length, uint32_t access) {
            auto region = e.transport().domain().register_memory(reinterpret_cast<uint8_t*>(addr),
                                                        checked_size(length, "length"), access);
            return std::make_shared<RegionHandle>(RegionHandle{kept_in_child(region), &e, true});
          },
          py::arg("addr"), py::arg("length"), py::arg("access"), py::keep_alive<0, 1>())
      .def(
          "alloc_pinned",
          [](Engine& e, long long length, uint32_t access) {
            const uint64_t n = checked_size(length, "length");
            auto& t = e.transport();
            std::shared_ptr<MemoryRegion> region;
            {
              GilRelease release;
              region = t.domain().alloc_pinned(n, access);
            }
            return std::make_shared<RegionHandle>(RegionHandle{kept_in_child(region), &e, true});
          },
          py::arg("length"), py::arg("access"), py::keep_alive<0, 1>())
      .def(
          "deregister",
          [](Engine& e, RegionHandle& h, double timeout) {
            checked_timeout(timeout, "deregister");
            if (!h.registered) {
              throw Error(ErrorKind::kInvalidArgument,
                          "the region is already deregistered (deregister it once)");
            }
            auto& t = e.transport();
            h.registered = false;
            GilRelease release;
            t.domain().deregister(h.region, timeout);
          },
          py::arg("region"), py::arg("timeout"))
      .def(
          "register_device",
          [](Engine& e, uint64_t addr, long long length, uint32_t access,
             const std::string& method, int device) {
            const uint64_t n = checked_size(length, "length");
            auto& t = e.gpu_registrar(method);
            std::shared_ptr<MemoryRegion> region;
            {
              GilRelease release;
              region = rdmaxfer::register_gpu_memory(t, addr, n, access, method, device);
            }
            return std::make_shared<RegionHandle>(RegionHandle{kept_in_child(region), &e, true});
          },
          py::arg("addr"), py::arg("length"), py::arg("access"), py::arg("method"),
          py::arg("device"), py::keep_alive<0, 1>())
      .def("drain_notifications", [](Engine& e) { return e.notifier()->drain(); })
      .def("registered_count", [](Engine& e) { return e.transport().domain().registered_count(); })
      .def("close", &Engine::close, py::call_guard<GilRelease>());

  rdmaxfer::bind_cuda(m);
  rdmaxfer::bind_batches(m);
  rdmaxfer::bind_same_host(m);
  rdmaxfer::bind_storage(m);
}
