#include "bindings/storage_bindings.h"

#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "bindings/gil.h"
#include "cuda/cufile_api.h"
#include "cuda/device_copier.h"
#include "transport/storage/file_reader.h"
#include "transport/storage/gds_reader.h"

namespace py = pybind11;

namespace rdmaxfer {

void bind_storage(py::module_& m) {
  m.def(
      "read_file_ranges",
      [](int fd, const std::string& path, uint64_t file_size,
         const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& direct,
         const std::vector<std::tuple<uint64_t, uint64_t, uint64_t, bool>>& copied,
         uint64_t align, uint64_t chunk, int depth, double timeout_s, bool use_uring,
         std::shared_ptr<DeviceCopier> copier, bool prefault) {
        std::vector<FileRange> d;
        d.reserve(direct.size());
        for (const auto& [off, len, dest] : direct) d.push_back(FileRange{off, len, dest, false});
        std::vector<FileRange> c;
        c.reserve(copied.size());
        for (const auto& [off, len, dest, dev] : copied) c.push_back(FileRange{off, len, dest, dev});
        FileReadOptions o;
        o.align = align;
        o.chunk = chunk;
        o.depth = depth;
        o.timeout_s = timeout_s;
        o.use_uring = use_uring;
        o.prefault = prefault;
        FileReadStats s;
        {
          GilRelease release;
          s = read_file_ranges(fd, path, file_size, d, c, o, copier);
        }
        py::dict out;
        out["bytes_read"] = s.bytes_read;
        out["reads"] = s.reads;
        out["copies"] = s.copies;
        out["engine"] = s.engine;
        return out;
      },
      py::arg("fd"), py::arg("path"), py::arg("file_size"), py::arg("direct"), py::arg("copied"),
      py::arg("align") = 4096, py::arg("chunk") = 4ull << 20, py::arg("depth") = 16,
      py::arg("timeout_s") = 60.0, py::arg("use_uring") = true, py::arg("copier") = nullptr,
      py::arg("prefault") = true,
      "Reads byte ranges of the open file `fd` (`file_size` bytes, named `path` in errors): "
      "`direct` [(file_offset, length, address)] straight into aligned host memory, `copied` "
      "[(file_offset, length, address, on_device)] through bounce buffers (device ranges "
      "through `copier`). `depth` reads of `chunk` bytes in flight, aligned to `align`; "
      "`prefault`: fault the direct ranges' pages in ahead on a second thread. "
      "Returns {bytes_read, reads, copies, engine}.");
  m.def("gds_unavailable", &gds_unavailable,
        "\"\" when GPUDirect Storage (libcufile) can be used here, else why not.");
  m.def(
      "gds_status",
      [] {
        CufileStatus s;
        {
          GilRelease release;
          s = cufile_status();
        }
        py::dict out;
        out["library"] = s.library;
        out["path"] = s.path;
        out["version"] = s.version;
        out["unavailable"] = s.unavailable;
        return out;
      },
      "What loading libcufile (GPUDirect Storage) found: {library: the name tried, path: the "
      "file loaded (\"\" when none), version (\"\" when unknown), unavailable: why GDS cannot "
      "be used (\"\" when it can)}.");
  m.def(
      "read_file_gds",
      [](int fd, const std::string& path, uint64_t file_size, int device,
         const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& ranges, uint64_t chunk) {
        std::vector<GdsRange> r;
        r.reserve(ranges.size());
        for (const auto& [off, len, dest] : ranges) r.push_back(GdsRange{off, len, dest});
        GdsStats s;
        {
          GilRelease release;
          s = read_file_gds(fd, path, file_size, device, r, chunk);
        }
        py::dict out;
        out["bytes_read"] = s.bytes_read;
        out["reads"] = s.reads;
        out["copies"] = 0;
        out["engine"] = "cufile";
        return out;
      },
      py::arg("fd"), py::arg("path"), py::arg("file_size"), py::arg("device"), py::arg("ranges"),
      py::arg("chunk") = 16ull << 20,
      "Reads [(file_offset, length, device_address)] of the O_DIRECT file `fd` into GPU "
      "`device`'s memory by cuFileRead (GPUDirect Storage). Returns {bytes_read, reads, "
      "copies, engine}.");
}

}  // namespace rdmaxfer
