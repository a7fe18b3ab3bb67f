#include "transport/storage/uring.h"

#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>

#include "common/error.h"

namespace rdmaxfer {

namespace {

#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#endif
#ifndef __NR_io_uring_enter
#define __NR_io_uring_enter 426
#endif

int uring_setup(unsigned entries, io_uring_params* p) {
  return static_cast<int>(syscall(__NR_io_uring_setup, entries, p));
}

int uring_enter(int fd, unsigned submit, unsigned min_complete, unsigned flags, const void* arg,
                size_t argsz) {
  return static_cast<int>(
      syscall(__NR_io_uring_enter, fd, submit, min_complete, flags, arg, argsz));
}

unsigned load_acquire(const unsigned* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

void store_release(unsigned* p, unsigned v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

void* map_ring(int fd, size_t size, off_t what, const char* name) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, what);
  if (p == MAP_FAILED) throw_errno(std::string("mmap of the io_uring ") + name);
  return p;
}

}  // namespace

std::unique_ptr<Uring> Uring::open(unsigned entries, std::string* why) {
  io_uring_params p;
  std::memset(&p, 0, sizeof(p));
  const int fd = uring_setup(entries, &p);
  if (fd < 0) {
    if (why != nullptr) *why = errno_text("io_uring_setup", errno);
    return nullptr;
  }
  // IORING_FEAT_EXT_ARG (Linux 5.11) carries the wait's timeout; older kernels read with pread.
  if ((p.features & IORING_FEAT_EXT_ARG) == 0) {
    ::close(fd);
    if (why != nullptr) *why = "io_uring without IORING_FEAT_EXT_ARG (Linux < 5.11)";
    return nullptr;
  }
  std::unique_ptr<Uring> u(new Uring());
  u->fd_.reset(fd);
  u->entries_ = p.sq_entries;
  u->sq_ring_size_ = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  u->cq_ring_size_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
  u->sqes_size_ = p.sq_entries * sizeof(io_uring_sqe);
  u->sq_ring_ = map_ring(fd, u->sq_ring_size_, IORING_OFF_SQ_RING, "submission ring");
  u->cq_ring_ = map_ring(fd, u->cq_ring_size_, IORING_OFF_CQ_RING, "completion ring");
  u->sqes_ = map_ring(fd, u->sqes_size_, IORING_OFF_SQES, "submission entries");
  auto* sq = static_cast<uint8_t*>(u->sq_ring_);
  auto* cq = static_cast<uint8_t*>(u->cq_ring_);
  u->sq_head_ = reinterpret_cast<unsigned*>(sq + p.sq_off.head);
  u->sq_tail_ = reinterpret_cast<unsigned*>(sq + p.sq_off.tail);
  u->sq_mask_ = *reinterpret_cast<unsigned*>(sq + p.sq_off.ring_mask);
  u->sq_array_ = reinterpret_cast<unsigned*>(sq + p.sq_off.array);
  u->cq_head_ = reinterpret_cast<unsigned*>(cq + p.cq_off.head);
  u->cq_tail_ = reinterpret_cast<unsigned*>(cq + p.cq_off.tail);
  u->cq_mask_ = *reinterpret_cast<unsigned*>(cq + p.cq_off.ring_mask);
  u->cqes_ = cq + p.cq_off.cqes;
  return u;
}

Uring::~Uring() {
  if (sqes_ != nullptr) munmap(sqes_, sqes_size_);
  if (cq_ring_ != nullptr) munmap(cq_ring_, cq_ring_size_);
  if (sq_ring_ != nullptr) munmap(sq_ring_, sq_ring_size_);
}

void Uring::read(int fd, void* buf, uint32_t length, uint64_t offset, uint64_t user_data) {
  const unsigned tail = *sq_tail_;
  if (tail - load_acquire(sq_head_) >= entries_) {
    throw Error(ErrorKind::kTransport, "io_uring submission ring full (a caller bug)");
  }
  const unsigned index = tail & sq_mask_;
  auto* sqe = static_cast<io_uring_sqe*>(sqes_) + index;
  std::memset(sqe, 0, sizeof(*sqe));
  sqe->opcode = IORING_OP_READ;
  sqe->fd = fd;
  sqe->addr = reinterpret_cast<uint64_t>(buf);
  sqe->len = length;
  sqe->off = offset;
  sqe->user_data = user_data;
  sq_array_[index] = index;
  store_release(sq_tail_, tail + 1);
  ++queued_;
}

int Uring::reap(UringCompletion* out, int max) {
  unsigned head = *cq_head_;
  const unsigned tail = load_acquire(cq_tail_);
  int n = 0;
  while (head != tail && n < max) {
    const auto* cqe = static_cast<const io_uring_cqe*>(cqes_) + (head & cq_mask_);
    out[n++] = UringCompletion{cqe->user_data, cqe->res};
    ++head;
  }
  store_release(cq_head_, head);
  return n;
}

int Uring::submit_and_wait(UringCompletion* out, int max, double timeout_s) {
  int n = reap(out, max);
  if (n > 0 && queued_ == 0) return n;
  __kernel_timespec ts;
  const double whole = std::floor(timeout_s);
  ts.tv_sec = static_cast<long long>(whole);
  ts.tv_nsec = static_cast<long long>((timeout_s - whole) * 1e9);
  io_uring_getevents_arg arg;
  std::memset(&arg, 0, sizeof(arg));
  arg.ts = reinterpret_cast<uint64_t>(&ts);
  for (;;) {
    const unsigned wait_for = n > 0 ? 0 : 1;
    const int rc = uring_enter(fd_.get(), queued_, wait_for,
                               IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG, &arg, sizeof(arg));
    if (rc >= 0) {
      queued_ -= static_cast<unsigned>(rc);
    } else if (errno == ETIME) {
      queued_ = 0;  // the kernel consumed the submissions before the wait timed out
    } else if (errno != EINTR && errno != EBUSY && errno != EAGAIN) {
      throw_errno("io_uring_enter");
    }
    n += reap(out + n, max - n);
    if (n > 0 || (rc < 0 && errno == ETIME)) return n;
  }
}

}  // namespace rdmaxfer
