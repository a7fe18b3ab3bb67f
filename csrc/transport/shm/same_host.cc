#include "transport/shm/same_host.h"

#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/unique_fd.h"

namespace rdmaxfer {

namespace {

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    throw Error(ErrorKind::kTransport, std::string("shm: cannot read ") + path +
                                           " (the shm transport needs /proc)");
  }
  return line;
}

std::string yama_note() {
  const int scope = yama_ptrace_scope();
  if (scope <= 0) return "";
  return "; Yama ptrace_scope is " + std::to_string(scope) +
         " (/proc/sys/kernel/yama/ptrace_scope): process_vm_readv/writev between sibling "
         "processes needs 0";
}

}  // namespace

HostIdentity HostIdentity::local() {
  HostIdentity id;
  id.boot_id = read_line("/proc/sys/kernel/random/boot_id");
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/ns/net", buf, sizeof(buf) - 1);
  if (n < 0) throw_errno(ErrorKind::kTransport, "shm: readlink(/proc/self/ns/net)", errno);
  id.netns.assign(buf, static_cast<size_t>(n));
  id.uid = static_cast<uint32_t>(geteuid());
  id.pid = static_cast<uint32_t>(getpid());
  return id;
}

std::string HostIdentity::pack() const {
  return boot_id + "\n" + netns + "\n" + std::to_string(uid) + "\n" + std::to_string(pid);
}

HostIdentity HostIdentity::unpack(const std::string& text) {
  std::istringstream in(text);
  HostIdentity id;
  std::string uid;
  std::string pid;
  if (!std::getline(in, id.boot_id) || !std::getline(in, id.netns) || !std::getline(in, uid) ||
      !std::getline(in, pid)) {
    throw Error(ErrorKind::kProtocol, "shm handshake: malformed host identity record");
  }
  try {
    id.uid = static_cast<uint32_t>(std::stoul(uid));
    id.pid = static_cast<uint32_t>(std::stoul(pid));
  } catch (const std::exception&) {
    throw Error(ErrorKind::kProtocol, "shm handshake: malformed uid/pid in the host identity");
  }
  return id;
}

std::string same_host_mismatch(const HostIdentity& mine, const HostIdentity& theirs,
                               pid_t peer_pid) {
  if (mine.boot_id != theirs.boot_id) {
    return "the peer runs on another kernel (boot id " + theirs.boot_id + " vs " + mine.boot_id +
           "): use transport='tcp' or 'rdma'";
  }
  if (mine.netns != theirs.netns) {
    return "the peer is in another network namespace (" + theirs.netns + " vs " + mine.netns +
           "): use transport='tcp'";
  }
  if (peer_pid <= 0 || static_cast<uint32_t>(peer_pid) != theirs.pid) {
    return "the peer is in another PID namespace (it is pid " + std::to_string(theirs.pid) +
           " there, " + std::to_string(peer_pid) +
           " here), so process_vm_readv cannot name it: use transport='tcp'";
  }
  if (mine.uid != theirs.uid) {
    return "the peer runs as another user (uid " + std::to_string(theirs.uid) + " vs " +
           std::to_string(mine.uid) +
           "): process_vm_readv/writev needs the same user or CAP_SYS_PTRACE; use "
           "transport='tcp'" + yama_note();
  }
  return "";
}

int yama_ptrace_scope() {
  std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (!(in >> scope)) return -1;
  return scope;
}

std::string shm_unavailable_reason() {
  try {
    HostIdentity::local();
  } catch (const Error& e) {
    return e.what();
  }
  UniqueFd mem(memfd_create("rdmaxfer-probe", MFD_CLOEXEC));
  if (!mem.valid()) return errno_text("memfd_create", errno);
  UniqueFd bell(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!bell.valid()) return errno_text("eventfd", errno);
  char src[8] = "rdmaxfe";
  char dst[8] = {};
  iovec local{dst, sizeof(dst)};
  iovec remote{src, sizeof(src)};
  if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != static_cast<ssize_t>(sizeof(dst))) {
    return errno_text("process_vm_readv (CMA) on this process", errno) +
           " (a seccomp profile or the kernel forbids it)" + yama_note();
  }
  return "";
}

}  // namespace rdmaxfer
