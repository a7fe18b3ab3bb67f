// Same-host checks of the shm transport: whether two processes share one kernel and one network
// namespace (so the UNIX socket and the memfd reach the same peer), and whether the kernel lets
// them copy between each other's memory with process_vm_readv/writev (CMA: same user or ptrace
// permission; Yama's ptrace_scope can forbid it).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace rdmaxfer {

struct HostIdentity {
  std::string boot_id;  // /proc/sys/kernel/random/boot_id
  std::string netns;    // readlink /proc/self/ns/net ("net:[4026531840]")
  uint32_t uid = 0;     // effective uid
  uint32_t pid = 0;     // getpid() in the sender's PID namespace

  static HostIdentity local();  // throws Error(kTransport) when /proc is unreadable
  std::string pack() const;     // "boot_id\nnetns\nuid\npid"
  static HostIdentity unpack(const std::string& text);  // throws Error(kProtocol)
};

// "" when `mine` and `theirs` (pid as SO_PEERCRED reports it, `peer_pid`) are one host, one
// network and PID namespace and one user; else the reason, naming the fix.
std::string same_host_mismatch(const HostIdentity& mine, const HostIdentity& theirs,
                               pid_t peer_pid);

// /proc/sys/kernel/yama/ptrace_scope: -1 when Yama is absent.
int yama_ptrace_scope();

// "" when this process can use the shm transport (memfd, eventfd and process_vm_readv on
// itself work), else why not.
std::string shm_unavailable_reason();

}  // namespace rdmaxfer
