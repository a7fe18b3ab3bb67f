// An io_uring ring through the raw system calls (io_uring_setup, io_uring_enter and the mmap'd
// rings): no liburing, so the package builds where liburing-dev is absent and runs on any
// kernel; where io_uring is missing or forbidden (ENOSYS, EPERM under a seccomp profile)
// Uring::open returns nullptr with the reason and callers read with pread instead.
//
// Lifecycle: open (setup + three mmaps) -> read()s queued, submit_and_wait() -> destroyed:
// the rings are unmapped and the ring's fd closed. One thread uses a ring at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/unique_fd.h"

namespace rdmaxfer {

struct UringCompletion {
  uint64_t user_data;
  int32_t result;  // bytes read, or -errno
};

class Uring {
 public:
  // A ring of `entries` submission slots, or nullptr with `why` set when io_uring cannot be
  // used here.
  static std::unique_ptr<Uring> open(unsigned entries, std::string* why);
  ~Uring();
  Uring(const Uring&) = delete;
  Uring& operator=(const Uring&) = delete;

  unsigned capacity() const { return entries_; }
  // Queues a read of `length` bytes at `offset` of `fd` into `buf` (a free submission slot
  // must exist: at most capacity() reads in flight).
  void read(int fd, void* buf, uint32_t length, uint64_t offset, uint64_t user_data);
  // Submits the queued reads and waits up to `timeout_s` for at least one completion. Returns
  // the number of completions written to `out` (at most `max`), 0 on timeout. Throws Error on
  // a failed io_uring_enter.
  int submit_and_wait(UringCompletion* out, int max, double timeout_s);

 private:
  Uring() = default;
  int reap(UringCompletion* out, int max);

  UniqueFd fd_;
  unsigned entries_ = 0;
  void* sq_ring_ = nullptr;
  size_t sq_ring_size_ = 0;
  void* cq_ring_ = nullptr;
  size_t cq_ring_size_ = 0;
  void* sqes_ = nullptr;
  size_t sqes_size_ = 0;
  unsigned* sq_head_ = nullptr;
  unsigned* sq_tail_ = nullptr;
  unsigned sq_mask_ = 0;
  unsigned* sq_array_ = nullptr;
  unsigned* cq_head_ = nullptr;
  unsigned* cq_tail_ = nullptr;
  unsigned cq_mask_ = 0;
  void* cqes_ = nullptr;
  unsigned queued_ = 0;  // SQEs written but not yet submitted
};

}  // namespace rdmaxfer
