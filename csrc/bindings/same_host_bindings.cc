#include "bindings/same_host_bindings.h"

#include <pybind11/stl.h>

#include <map>
#include <string>

#include "transport/shm/same_host.h"

namespace py = pybind11;

namespace rdmaxfer {

namespace {

py::dict identity_dict(const HostIdentity& id) {
  py::dict d;
  d["boot_id"] = id.boot_id;
  d["netns"] = id.netns;
  d["uid"] = id.uid;
  d["pid"] = id.pid;
  return d;
}

}  // namespace

void bind_same_host(py::module_& m) {
  m.def(
      "host_identity", [] { return identity_dict(HostIdentity::local()); },
      "This process as the shm handshake announces it: boot_id "
      "(/proc/sys/kernel/random/boot_id), netns (/proc/self/ns/net), uid (effective), pid.");
  m.def(
      "same_host_mismatch",
      [](const std::string& boot_id, const std::string& netns, uint32_t uid, uint32_t pid,
         int peer_pid) {
        HostIdentity theirs;
        theirs.boot_id = boot_id;
        theirs.netns = netns;
        theirs.uid = uid;
        theirs.pid = pid;
        return same_host_mismatch(HostIdentity::local(), theirs, peer_pid);
      },
      py::arg("boot_id"), py::arg("netns"), py::arg("uid"), py::arg("pid"), py::arg("peer_pid"),
      "\"\" when a peer announcing these values (its pid as SO_PEERCRED reports it: peer_pid) "
      "can use shm with this process, else the reason, naming the fix.");
  m.def("yama_ptrace_scope", &yama_ptrace_scope,
        "/proc/sys/kernel/yama/ptrace_scope, or -1 without Yama.");
}

}  // namespace rdmaxfer
