// One copy between this process and a peer process on the same host (CMA: process_vm_readv /
// process_vm_writev). A large copy is split over a few threads: one thread's
// process_vm_writev of 1 GiB measured 0.62x of a single-process memcpy (issue 14).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rdmaxfer {

enum class CmaDirection { kPull, kPush };  // pull: peer -> local (readv); push: local -> peer

// Copies `length` bytes between `local` (this process) and `remote` (an address in process
// `pid`). Returns 0, or the errno of the first failed call (ESRCH: the peer is gone; EFAULT: an
// address is not mapped; EPERM: no ptrace permission).
int cma_copy(pid_t pid, CmaDirection direction, uint8_t* local, uint64_t remote,
             uint64_t length);

// One piece of a vectored copy: `length` bytes between `local` (this process) and the peer's
// address `remote`.
struct CmaPiece {
  uint8_t* local = nullptr;
  uint64_t remote = 0;
  uint64_t length = 0;
};

// Copies every piece with one process_vm_readv/writev per IOV_MAX pieces (both iovec lists),
// resuming after a partial transfer, on the calling thread (the shm transport copies several
// gathered groups at once, one per worker: shm_gather.cc). `errors` gets, per piece, 0 or the
// errno of its failed copy: a piece that fails fails alone and the ones after it are still
// copied (all of them fail at once when the peer is gone, ESRCH). Returns the failed pieces.
size_t cma_copy_pieces(pid_t pid, CmaDirection direction, const std::vector<CmaPiece>& pieces,
                       std::vector<int>* errors);

// Why a copy with peer `peer` failed: `what` (the call) and the errno text of `err`.
std::string cma_failure(const char* what, int err, const std::string& peer);

// Threads one copy of `length` bytes uses.
int cma_threads(uint64_t length);

}  // namespace rdmaxfer
