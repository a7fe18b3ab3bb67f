#include "bindings/cuda_bindings.h"

#include <pybind11/stl.h>

#include <vector>

#include "bindings/gil.h"
#include "bindings/region_handle.h"
#include "common/error.h"
#include "cuda/cuda_context.h"
#include "cuda/cuda_copier.h"
#include "cuda/cuda_memory.h"
#include "cuda/cuda_stream.h"
#include "cuda/host_copier.h"
#include "engine/engine.h"
#include "protocol/staging.h"
#include "transport/gpu_registration.h"
#include "transport/rdma/rdma_registration.h"

namespace py = pybind11;

namespace rdmaxfer {

namespace {

// DLPack's C ABI (dlpack.h v0.8, the unversioned "dltensor" capsule every consumer accepts),
// declared here so the build needs no dlpack header.
struct DLDevice {
  int32_t device_type;  // kDLCPU = 1, kDLCUDA = 2
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // nullptr: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

struct ExportContext {
  DLManagedTensor tensor{};
  std::vector<int64_t> shape;
  py::object owner;  // keeps the memory alive until the consumer calls the deleter
};

void delete_export(DLManagedTensor* t) {
  auto* ctx = static_cast<ExportContext*>(t->manager_ctx);
  if (!Py_IsInitialized()) return;  // interpreter gone: leak rather than touch Python
  py::gil_scoped_acquire gil;
  delete ctx;
}

void capsule_destructor(PyObject* capsule) {
  // Still named "dltensor": no consumer took it, so the capsule owns the tensor.
  if (PyCapsule_IsValid(capsule, "dltensor") == 0) return;
  auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (t != nullptr && t->deleter != nullptr) t->deleter(t);
}

py::object dlpack_capsule(py::object owner, uint64_t ptr, int device_type, int device_id,
                          const std::vector<int64_t>& shape, int code, int bits) {
  auto* ctx = new ExportContext();
  ctx->owner = std::move(owner);
  ctx->shape = shape;
  DLTensor& t = ctx->tensor.dl_tensor;
  t.data = reinterpret_cast<void*>(ptr);
  t.device = DLDevice{device_type, device_id};
  t.ndim = static_cast<int32_t>(ctx->shape.size());
  t.dtype = DLDataType{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
  t.shape = ctx->shape.empty() ? nullptr : ctx->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  ctx->tensor.manager_ctx = ctx;
  ctx->tensor.deleter = delete_export;
  PyObject* capsule = PyCapsule_New(&ctx->tensor, "dltensor", capsule_destructor);
  if (capsule == nullptr) {
    delete ctx;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

py::dict status_dict() {
  const CudaStatus s = cuda_status();
  py::dict d;
  d["unavailable"] = s.unavailable;
  d["driver_version"] = s.driver_version;
  d["get_handle_for_address_range"] = s.get_handle_for_address_range;
  d["cuda_ipc"] = s.cuda_ipc;
  d["can_access_peer"] = s.can_access_peer;
  py::list gpus;
  for (const GpuInfo& g : s.gpus) {
    py::dict x;
    x["index"] = g.ordinal;
    x["name"] = g.name;
    x["pci_bus_id"] = g.pci_bus_id;
    x["total_memory"] = g.total_memory;
    x["compute_capability"] = py::make_tuple(g.cc_major, g.cc_minor);
    x["gpu_direct_rdma"] = g.gpu_direct_rdma;
    x["dma_buf"] = g.dma_buf;
    x["peer_access"] = g.peers;
    gpus.append(x);
  }
  d["gpus"] = gpus;
  return d;
}

StagingOptions staging_options(long long chunk, int slots, double timeout, int streams) {
  if (chunk < 0) throw Error(ErrorKind::kInvalidArgument, "chunk_size must be >= 0 bytes");
  if (!(timeout >= 0) || timeout > 1e9) {
    throw Error(ErrorKind::kInvalidArgument, "timeout must be a finite number of seconds >= 0");
  }
  if (streams < 0) throw Error(ErrorKind::kInvalidArgument, "streams must be >= 0");
  StagingOptions o;
  o.chunk = static_cast<uint64_t>(chunk);
  o.slots = slots;
  o.timeout_s = timeout;
  o.wire.streams = streams;
  return o;
}

uint64_t size_arg(long long v, const char* what) {
  if (v < 0) throw Error(ErrorKind::kInvalidArgument, std::string(what) + " must be >= 0");
  return static_cast<uint64_t>(v);
}

}  // namespace

void bind_cuda(py::module_& m) {
  m.def("cuda_status", &status_dict,
        "CUDA driver status: {'unavailable': reason or '', 'driver_version', 'gpus': [...]}");
  m.def("verbs_dmabuf_unavailable", &verbs_dmabuf_unavailable);
  m.def(
      "pointer_kind",
      [](uint64_t addr) {
        const PointerInfo info = pointer_info(addr);
        return py::make_tuple(pointer_kind_name(info.kind), info.device);
      },
      py::arg("addr"));
  m.def(
      "cuda_allocation",
      [](uint64_t addr) {
        AllocationRange r;
        {
          GilRelease release;
          r = allocation_range(addr);
        }
        return py::make_tuple(r.base, r.size, r.buffer_id);
      },
      py::arg("addr"),
      "The device allocation holding addr: (base, bytes, CU_POINTER_ATTRIBUTE_BUFFER_ID or 0)");
  m.def("cuda_synchronize_stream", &synchronize_stream_handle, py::arg("device"),
        py::arg("stream"), py::call_guard<GilRelease>());
  m.def(
      "cuda_copy_to_host",
      [](int device, uint64_t dst, uint64_t src, long long length) {
        const uint64_t n = size_arg(length, "length");
        GilRelease release;
        copy_device_to_host(CudaContext::get(device), reinterpret_cast<void*>(dst), src, n);
      },
      py::arg("device"), py::arg("dst"), py::arg("src"), py::arg("length"));
  m.def(
      "cuda_copy_to_device",
      [](int device, uint64_t dst, uint64_t src, long long length) {
        const uint64_t n = size_arg(length, "length");
        GilRelease release;
        copy_host_to_device(CudaContext::get(device), dst, reinterpret_cast<const void*>(src),
                            n);
      },
      py::arg("device"), py::arg("dst"), py::arg("src"), py::arg("length"));
  m.def("dlpack_capsule", &dlpack_capsule, py::arg("owner"), py::arg("ptr"),
        py::arg("device_type"), py::arg("device_id"), py::arg("shape"), py::arg("code"),
        py::arg("bits"));

  py::class_<DeviceAllocation, std::shared_ptr<DeviceAllocation>>(m, "DeviceMemory")
      .def(py::init([](int device, long long length) {
             const uint64_t n = size_arg(length, "length");
             auto ctx = CudaContext::get(device);
             GilRelease release;
             return std::make_shared<DeviceAllocation>(ctx, n);
           }),
           py::arg("device"), py::arg("length"))
      .def_property_readonly("ptr", &DeviceAllocation::ptr)
      .def_property_readonly("length", &DeviceAllocation::length)
      .def_property_readonly("device", &DeviceAllocation::ordinal);

  py::class_<PinnedHostAllocation, std::shared_ptr<PinnedHostAllocation>>(m, "PinnedHostMemory")
      .def(py::init([](int device, long long length) {
             const uint64_t n = size_arg(length, "length");
             auto ctx = CudaContext::get(device);
             GilRelease release;
             return std::make_shared<PinnedHostAllocation>(ctx, n);
           }),
           py::arg("device"), py::arg("length"))
      .def_property_readonly("ptr",
                             [](const PinnedHostAllocation& a) {
                               return reinterpret_cast<uint64_t>(a.data());
                             })
      .def_property_readonly("length", &PinnedHostAllocation::length);

  py::class_<DeviceCopier, std::shared_ptr<DeviceCopier>>(m, "DeviceCopier")
      .def("describe", &DeviceCopier::describe);
  py::class_<HostCopier, DeviceCopier, std::shared_ptr<HostCopier>>(m, "HostCopier")
      .def(py::init([](long long delay_us, long long fail_at, long long hang_at) {
             HostCopierFaults f;
             f.delay_us = delay_us;
             f.fail_at = fail_at;
             f.hang_at = hang_at;
             return std::make_shared<HostCopier>(f);
           }),
           py::arg("delay_us") = 0, py::arg("fail_at") = -1, py::arg("hang_at") = -1)
      .def_property_readonly("copies_started", &HostCopier::copies_started);
  py::class_<CudaCopier, DeviceCopier, std::shared_ptr<CudaCopier>>(m, "CudaCopier")
      .def(py::init<int>(), py::arg("device"));

  py::class_<Stager>(m, "Stager")
      .def(py::init([](Engine& engine, std::shared_ptr<DeviceCopier> copier) {
             return std::make_unique<Stager>(engine.transport(), std::move(copier));
           }),
           py::arg("engine"), py::arg("copier"), py::keep_alive<1, 2>())
      .def(
          "post_write",
          [](Stager& s, const std::shared_ptr<Connection>& ep, uint64_t device, long long length,
             const Descriptor& remote, long long remote_offset, long long chunk_size, int slots,
             double timeout, int streams) {
            auto o = staging_options(chunk_size, slots, timeout, streams);
            const uint64_t n = size_arg(length, "length");
            const uint64_t ro = size_arg(remote_offset, "remote_offset");
            GilRelease release;
            return s.post_write(ep, device, n, remote, ro, o);
          },
          py::arg("endpoint"), py::arg("device"), py::arg("length"), py::arg("remote"),
          py::arg("remote_offset") = 0, py::arg("chunk_size") = 0, py::arg("slots") = 0,
          py::arg("timeout") = 60.0, py::arg("streams") = 0)
      .def(
          "post_read",
          [](Stager& s, const std::shared_ptr<Connection>& ep, uint64_t device, long long length,
             const Descriptor& remote, long long remote_offset, long long chunk_size, int slots,
             double timeout, int streams) {
            auto o = staging_options(chunk_size, slots, timeout, streams);
            const uint64_t n = size_arg(length, "length");
            const uint64_t ro = size_arg(remote_offset, "remote_offset");
            GilRelease release;
            return s.post_read(ep, device, n, remote, ro, o);
          },
          py::arg("endpoint"), py::arg("device"), py::arg("length"), py::arg("remote"),
          py::arg("remote_offset") = 0, py::arg("chunk_size") = 0, py::arg("slots") = 0,
          py::arg("timeout") = 60.0, py::arg("streams") = 0)
      .def(
          "post_send",
          [](Stager& s, const std::shared_ptr<Connection>& ep, uint64_t device, long long length,
             const py::bytes& meta, double timeout, int streams, long long chunk_size,
             int slots) {
            auto o = staging_options(chunk_size, slots, timeout, streams);
            const uint64_t n = size_arg(length, "length");
            std::string meta_s = meta;
            GilRelease release;
            return s.post_send(ep, device, n, meta_s, o);
          },
          py::arg("endpoint"), py::arg("device"), py::arg("length"), py::arg("meta"),
          py::arg("timeout") = 60.0, py::arg("streams") = 0, py::arg("chunk_size") = 0,
          py::arg("slots") = 0)
      .def(
          "post_recv",
          [](Stager& s, const std::shared_ptr<Connection>& ep, uint64_t msg_id, uint64_t device,
             long long length, double timeout, long long chunk_size, int slots) {
            auto o = staging_options(chunk_size, slots, timeout, 0);
            const uint64_t n = size_arg(length, "length");
            GilRelease release;
            return s.post_recv(ep, msg_id, device, n, o);
          },
          py::arg("endpoint"), py::arg("msg_id"), py::arg("device"), py::arg("length"),
          py::arg("timeout") = 60.0, py::arg("chunk_size") = 0, py::arg("slots") = 0)
      .def(
          "post_send_direct",
          [](Stager& s, const std::shared_ptr<Connection>& ep,
             const std::shared_ptr<RegionHandle>& region, long long offset, long long length,
             const py::bytes& meta, int streams, long long chunk_size) {
            auto o = staging_options(chunk_size, 0, 60.0, streams);
            o.wire.chunk_size = static_cast<uint64_t>(chunk_size);
            auto r = live_region(*region);
            const uint64_t at = size_arg(offset, "offset");
            const uint64_t n = size_arg(length, "length");
            std::string meta_s = meta;
            GilRelease release;
            return s.post_send_direct(ep, r, at, n, meta_s, o);
          },
          py::arg("endpoint"), py::arg("region"), py::arg("offset"), py::arg("length"),
          py::arg("meta"), py::arg("streams") = 0, py::arg("chunk_size") = 0)
      .def(
          "post_recv_direct",
          [](Stager& s, const std::shared_ptr<Connection>& ep, uint64_t msg_id,
             const std::shared_ptr<RegionHandle>& region, long long offset, long long length,
             double timeout) {
            auto o = staging_options(0, 0, timeout, 0);
            auto r = live_region(*region);
            const uint64_t at = size_arg(offset, "offset");
            const uint64_t n = size_arg(length, "length");
            GilRelease release;
            return s.post_recv_direct(ep, msg_id, r, at, n, o);
          },
          py::arg("endpoint"), py::arg("msg_id"), py::arg("region"), py::arg("offset"),
          py::arg("length"), py::arg("timeout") = 60.0)
      .def("pool_stats",
           [](const Stager& s) {
             const BouncePoolStats p = s.pool_stats();
             py::dict d;
             d["slab_bytes"] = p.slab_bytes;
             d["max_slabs"] = p.max_slabs;
             d["slabs"] = p.slabs;
             d["free"] = p.free;
             d["allocations"] = p.allocations;
             d["acquires"] = p.acquires;
             d["waits"] = p.waits;
             d["timeouts"] = p.timeouts;
             d["stranded"] = p.stranded;
             d["peak_slabs"] = p.peak_slabs;
             return d;
           })
      .def("stats",
           [](const Stager& s) {
             const StagerStats t = s.stats();
             py::dict d;
             d["messages_direct"] = t.messages_direct;
             d["messages_whole"] = t.messages_whole;
             d["messages_windowed"] = t.messages_windowed;
             d["overlapped_copies"] = t.overlapped_copies;
             return d;
           })
      .def_property_readonly("active", &Stager::active)
      .def_property_readonly("workers", &Stager::workers)
      .def("describe", &Stager::describe)
      .def("close", &Stager::close, py::call_guard<GilRelease>());
}

}  // namespace rdmaxfer
