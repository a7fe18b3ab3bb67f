// One copy between this process and a peer process on the same host (CMA: process_vm_readv /
// process_vm_writev). A large copy is split over a few threads: one thread's
// process_vm_writev of 1 GiB measured 0.62x of a single-process memcpy (issue 14).
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace rdmaxfer {

enum class CmaDirection { kPull, kPush };  // pull: peer -> local (readv); push: local -> peer

// Copies `length` bytes between `local` (this process) and `remote` (an address in process
// `pid`). Returns 0, or the errno of the first failed call (ESRCH: the peer is gone; EFAULT: an
// address is not mapped; EPERM: no ptrace permission).
int cma_copy(pid_t pid, CmaDirection direction, uint8_t* local, uint64_t remote,
             uint64_t length);

// Threads one copy of `length` bytes uses.
int cma_threads(uint64_t length);

}  // namespace rdmaxfer
