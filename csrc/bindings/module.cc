// Python bindings: the module's constants and functions, Descriptor, Region and Engine (class
// definitions only; Request and Endpoint are in bindings/endpoint_bindings.cc). Blocking calls
// release the GIL; errors become Python exceptions in bindings/errors.cc.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings/batch_bindings.h"
#include "bindings/conversions.h"
#include "bindings/endpoint_bindings.h"
#include "bindings/ofi_bindings.h"
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
#include "core/poll_mode.h"
#include "core/region.h"
#include "engine/engine.h"
#include "protocol/connection.h"
#include "transport/gpu_registration.h"
#include "transport/records.h"
#include "transport/registry.h"

namespace py = pybind11;
using rdmaxfer::Connection;
using rdmaxfer::Descriptor;
using rdmaxfer::Engine;
using rdmaxfer::Error;
using rdmaxfer::GilRelease;
using rdmaxfer::ErrorKind;
using rdmaxfer::MemoryRegion;
using rdmaxfer::RegionHandle;
using rdmaxfer::checked_size;
using rdmaxfer::checked_timeout;
using rdmaxfer::stats_dict;

namespace {

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

// Destroys an Engine without the GIL: its shutdown joins I/O threads that may be waiting for the
// GIL to log (bindings/log_bridge.h).
struct ReleaseGilDelete {
  void operator()(Engine* engine) const {
    GilRelease release;
    delete engine;
  }
};
using EnginePtr = std::unique_ptr<Engine, ReleaseGilDelete>;

// A transport's declared capabilities (transport/transport.h) as Python sees them.
py::dict capabilities_dict(const rdmaxfer::Capabilities& caps) {
  py::dict d;
  d["name"] = caps.name;
  d["wire_id"] = caps.wire_id;
  d["listed"] = caps.listed;
  d["network"] = caps.network;
  d["auto_rank"] = caps.auto_rank;
  d["same_host_companion"] = caps.same_host_companion;
  d["tls"] = caps.tls;
  d["bootstrap"] = caps.bootstrap;
  d["one_sided"] = caps.one_sided;
  d["write_with_imm"] = caps.write_with_imm;
  d["gpu_direct"] = caps.gpu_direct;
  d["device_ipc"] = caps.device_ipc;
  d["rails"] = caps.rails;
  d["max_message"] = caps.max_message;
  return d;
}

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
  m.def(
      "transports",
      [] {
        py::dict out;
        for (const rdmaxfer::TransportEntry* e : rdmaxfer::registered_transports()) {
          py::dict d = capabilities_dict(e->caps);
          d["unavailable"] = rdmaxfer::unavailable_reason(*e);
          out[py::str(e->caps.name)] = d;
        }
        return out;
      },
      "Every transport of this build by name: its declared capabilities and why it cannot run "
      "here (\"\" when it can).");
  m.def("automatic_network_transport",
        [] { return rdmaxfer::automatic_network_transport().name; });
  m.def(
      "choose_automatic",
      [](const std::vector<std::tuple<std::string, int, std::string>>& candidates) {
        std::vector<rdmaxfer::AutoCandidate> in;
        for (const auto& [name, rank, refused] : candidates) {
          in.push_back(
              rdmaxfer::AutoCandidate{name, rank, [refused = refused] { return refused; }});
        }
        const rdmaxfer::AutoChoice c = rdmaxfer::choose_automatic(std::move(in));
        return std::make_pair(c.name, c.why);
      },
      "transport=\"auto\"'s rule over (name, auto_rank, why auto may not take it) triples: "
      "(the name taken, why).");
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
                               return rdmaxfer::transport_id_name(d.transport);
                             })
      .def_readonly("access", &Descriptor::access)
      .def_readonly("addr", &Descriptor::addr)
      .def_readonly("length", &Descriptor::length)
      .def_readonly("key", &Descriptor::key)
      .def_readonly("rail_keys", &Descriptor::rail_keys)
      .def_readonly("generation", &Descriptor::generation)
      .def_readonly("engine_id", &Descriptor::engine_id)
      .def("pack", [](const Descriptor& d) { return py::bytes(d.pack()); })
      .def_static("unpack", &unpack_descriptor, py::arg("data"))
      .def("__eq__", [](const Descriptor& a, const Descriptor& b) { return a.pack() == b.pack(); })
      .def("__repr__", [](const Descriptor& d) {
        return "Descriptor(transport=" + rdmaxfer::transport_id_name(d.transport) +
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

  rdmaxfer::bind_endpoints(m);

  py::class_<Engine, EnginePtr>(m, "Engine")
      .def(py::init([](const std::string& transport, int io_threads, int socket_buffer,
                       int default_streams, const std::string& rdma_device, int gid_index,
                       const std::string& poll_mode, const std::string& secret,
                       const std::vector<std::string>& rdma_devices, int service_level,
                       int traffic_class, int min_rnr_timer,
                       const std::map<std::string, std::string>& settings,
                       uint64_t max_message_bytes) {
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
             config.io_threads = io_threads;
             config.socket_buffer = socket_buffer;
             config.default_streams = default_streams;
             config.poll_mode = rdmaxfer::parse_poll_mode(poll_mode);  // checked for all
             config.secret = secret;
             // The verbs transport's own settings, as the text it parses and checks.
             std::string devices;
             for (const std::string& name : rdma_devices) {
               devices += (devices.empty() ? "" : ",") + name;
             }
             config.settings = {{"rdma.device", rdma_device},
                                {"rdma.devices", devices},
                                {"rdma.gid_index", std::to_string(gid_index)},
                                {"rdma.service_level", std::to_string(service_level)},
                                {"rdma.traffic_class", std::to_string(traffic_class)},
                                {"rdma.min_rnr_timer", std::to_string(min_rnr_timer)}};
             for (const auto& [name, value] : settings) config.settings[name] = value;
             config.max_message_bytes = max_message_bytes;
             rdmaxfer::refresh_log_level();
             GilRelease release;
             return EnginePtr(new Engine(transport, config));
           }),
           py::arg("transport") = "tcp", py::arg("io_threads") = 0, py::arg("socket_buffer") = 0,
           py::arg("default_streams") = 0, py::arg("rdma_device") = "",
           py::arg("gid_index") = -1, py::arg("poll_mode") = "", py::arg("secret") = "",
           py::arg("rdma_devices") = std::vector<std::string>{}, py::arg("service_level") = -1,
           py::arg("traffic_class") = -1, py::arg("min_rnr_timer") = -1,
           py::arg("settings") = std::map<std::string, std::string>{},
           py::arg("max_message_bytes") = 0)
      .def_property_readonly("transport", &Engine::transport_name)
      .def_property_readonly("auto_why", &Engine::auto_why)
      .def_property_readonly("automatic", &Engine::automatic)
      .def_property_readonly("has_shm_companion", &Engine::has_shm_companion)
      .def_property_readonly("shm_off", [](Engine& e) { return e.wireup().shm_off(); })
      .def_property_readonly("engine_id", &Engine::engine_id)
      .def_property_readonly("notify_fd", [](const Engine& e) { return e.notifier()->fd(); })
      .def("capabilities",
           [](Engine& e) {
             auto caps = e.transport().capabilities();
             py::dict d = capabilities_dict(caps);
             d["transport"] = caps.name;
             return d;
           })
      .def("describe", [](Engine& e) { return e.transport().describe(); })
      .def_property_readonly("gpu_direct_off",
                             [](Engine& e) { return e.transport().gpu_direct_off(); })
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
  rdmaxfer::bind_ofi(m);
  rdmaxfer::bind_storage(m);
}
