// One sendmsg/recvmsg message on a UNIX socket: a fixed run of bytes carrying up to kMaxFds file
// descriptors (SCM_RIGHTS). Used by the shm handshake (the ring's memfd and doorbell) and by
// ShmChannel for the fds of VMM allocations.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstring>

#include "common/unique_fd.h"

namespace rdmaxfer {

class FdMessage {
 public:
  static constexpr int kMaxFds = 2;

  // `data`: the bytes sent, or the room the bytes are received into (`length` bytes).
  FdMessage(void* data, size_t length) : iov_{data, length} {
    msg_.msg_iov = &iov_;
    msg_.msg_iovlen = 1;
    msg_.msg_control = control_;
    msg_.msg_controllen = sizeof(control_);
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;

  // Before sendmsg: carry `count` (1..kMaxFds) descriptors, still owned by the caller.
  void attach(const int* fds, int count) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(int);
    msg_.msg_controllen = CMSG_SPACE(bytes);
    cmsghdr* c = CMSG_FIRSTHDR(&msg_);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(bytes);
    std::memcpy(CMSG_DATA(c), fds, bytes);
  }

  // After recvmsg: the descriptors that came, owned by `out` (`count` of them); false, with
  // every one that came closed, unless exactly `count` came and nothing was truncated.
  bool take(UniqueFd* out, int count) {
    UniqueFd got[kMaxFds];
    int n = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg_); c != nullptr; c = CMSG_NXTHDR(&msg_, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t fds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < fds; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
        UniqueFd owned(fd);
        if (n < kMaxFds) got[n] = std::move(owned);
        ++n;  // one past kMaxFds is closed by `owned` and fails the check below
      }
    }
    if (n != count || (msg_.msg_flags & MSG_CTRUNC) != 0) return false;
    for (int i = 0; i < count; ++i) out[i] = std::move(got[i]);
    return true;
  }

  msghdr* msg() { return &msg_; }
  int flags() const { return msg_.msg_flags; }

 private:
  iovec iov_;
  alignas(cmsghdr) char control_[CMSG_SPACE(kMaxFds * sizeof(int))] = {};
  msghdr msg_{};
};

}  // namespace rdmaxfer
