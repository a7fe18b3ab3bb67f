#include "bindings/batch_entries.h"

#include <pybind11/numpy.h>

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace rdmaxfer {

namespace {

// An exact Python int (not a bool, nor an int subclass) >= 0 that fits 64 bits, into `out`.
bool plain_offset(PyObject* value, uint64_t* out) {
  if (!PyLong_CheckExact(value)) return false;
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
  if (overflow != 0 || v < 0) {
    PyErr_Clear();
    return false;
  }
  *out = static_cast<uint64_t>(v);
  return true;
}

// Objects numbered by identity as they first come (the entries hold them alive meanwhile).
class Numbering {
 public:
  // The number of `obj`; a new one calls `add` (which appends what the number names).
  template <typename Add>
  uint64_t of(PyObject* obj, Add&& add) {
    if (obj == last_) return last_index_;
    auto [it, fresh] = index_.try_emplace(obj, index_.size());
    if (fresh) {
      add();
      objects_.append(py::reinterpret_borrow<py::object>(obj));
    }
    last_ = obj;
    last_index_ = it->second;
    return it->second;
  }
  const py::list& objects() const { return objects_; }

 private:
  std::unordered_map<PyObject*, uint64_t> index_;
  py::list objects_;
  PyObject* last_ = nullptr;
  uint64_t last_index_ = 0;
};

// entries -> (region objects, their cores, remote objects, their descriptors, table (N, 5)).
// An entry of the shape ((MemoryRegion, int, int), remote, int), region exactly of
// `region_type`, offsets plain ints >= 0, is read here; any other goes to `slow(index,
// entry)`, which checks it (raising the package's error) and returns (region, offset, nbytes,
// remote, remote_offset). A region's core is its `core` attribute; a remote object's
// descriptor is `descriptor_of(remote)`, once per distinct object.
py::tuple batch_table(const py::iterable& entries, const py::handle& region_type,
                      const py::function& slow, const py::function& descriptor_of) {
  // A list or tuple: its rows go straight into the table; any other iterable through `rows`.
  const bool sized = PyList_Check(entries.ptr()) || PyTuple_Check(entries.ptr());
  const py::ssize_t expect = sized ? static_cast<py::ssize_t>(py::len(entries)) : 0;
  py::array_t<uint64_t> table({expect, static_cast<py::ssize_t>(kPlanColumns)});
  uint64_t* direct = table.mutable_data();
  std::vector<uint64_t> rows;
  Numbering regions;
  Numbering remotes;
  py::list cores;
  py::list descriptors;
  auto* type = reinterpret_cast<PyTypeObject*>(region_type.ptr());
  uint64_t index = 0;
  for (const py::handle entry : entries) {
    PyObject* e = entry.ptr();
    PyObject* region = nullptr;
    PyObject* remote = nullptr;
    uint64_t offset = 0;
    uint64_t nbytes = 0;
    uint64_t at = 0;
    py::object normal;  // what slow() returned, alive while its parts are used
    bool fast = PyTuple_CheckExact(e) && PyTuple_GET_SIZE(e) == 3;
    if (fast) {
      PyObject* local = PyTuple_GET_ITEM(e, 0);
      fast = PyTuple_CheckExact(local) && PyTuple_GET_SIZE(local) == 3 &&
             Py_TYPE(PyTuple_GET_ITEM(local, 0)) == type &&
             plain_offset(PyTuple_GET_ITEM(local, 1), &offset) &&
             plain_offset(PyTuple_GET_ITEM(local, 2), &nbytes) &&
             plain_offset(PyTuple_GET_ITEM(e, 2), &at);
      if (fast) {
        region = PyTuple_GET_ITEM(local, 0);
        remote = PyTuple_GET_ITEM(e, 1);
      }
    }
    if (!fast) {
      normal = slow(index, entry);
      const py::tuple parts = normal.cast<py::tuple>();
      region = parts[0].ptr();
      offset = parts[1].cast<uint64_t>();
      nbytes = parts[2].cast<uint64_t>();
      remote = parts[3].ptr();
      at = parts[4].cast<uint64_t>();
    }
    const uint64_t r =
        regions.of(region, [&] { cores.append(py::handle(region).attr("core")); });
    const uint64_t d =
        remotes.of(remote, [&] { descriptors.append(descriptor_of(py::handle(remote))); });
    if (sized && index < static_cast<uint64_t>(expect)) {
      uint64_t* row = direct + index * kPlanColumns;
      row[0] = r;
      row[1] = offset;
      row[2] = d;
      row[3] = at;
      row[4] = nbytes;
    } else {
      rows.insert(rows.end(), {r, offset, d, at, nbytes});
    }
    ++index;
  }
  if (!sized || index != static_cast<uint64_t>(expect)) {
    // An iterable of unknown length (or a list that changed size while read: slow() may run
    // Python code): the table from the rows read.
    py::array_t<uint64_t> all(
        {static_cast<py::ssize_t>(index), static_cast<py::ssize_t>(kPlanColumns)});
    uint64_t* out = all.mutable_data();
    const uint64_t kept = sized ? std::min<uint64_t>(index, static_cast<uint64_t>(expect)) : 0;
    std::copy(direct, direct + kept * kPlanColumns, out);
    std::copy(rows.begin(), rows.end(), out + kept * kPlanColumns);
    table = std::move(all);
  }
  return py::make_tuple(regions.objects(), cores, remotes.objects(), descriptors, table);
}

}  // namespace

void bind_batch_entries(py::module_& m) {
  m.def("batch_table", &batch_table, py::arg("entries"), py::arg("region_type"),
        py::arg("slow"), py::arg("descriptor_of"));
}

}  // namespace rdmaxfer
