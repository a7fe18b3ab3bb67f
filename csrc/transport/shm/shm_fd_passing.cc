// ShmChannel's socket after set-up: the fds of VMM allocations (shm_channel.h, shm/cuda_ipc.h)
// passed with SCM_RIGHTS, each as 8 bytes (the allocation's id) carrying one fd.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/shm/fd_message.h"
#include "transport/shm/shm_channel.h"

namespace rdmaxfer {

namespace {

// A record naming a VMM allocation waits at most this long for its fd on the socket (sent
// before the record).
constexpr double kVmmFdTimeoutS = 10.0;

}  // namespace

bool ShmChannel::read_socket() {
  for (;;) {
    uint64_t id = 0;
    FdMessage m(&id, sizeof(id));
    const ssize_t n = recvmsg(sock_.get(), m.msg(), MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) return false;
    UniqueFd fd;
    if (!m.take(&fd, 1) || n != static_cast<ssize_t>(sizeof(id))) {
      throw Error(ErrorKind::kProtocol, "unexpected bytes on the shm socket");
    }
    vmm_in_[id] = std::move(fd);
  }
}

void ShmChannel::share_vmm(const MemoryRegion& local) {
  const IpcDeviceRegion* device = ipc_device_region(&local);
  if (device == nullptr || device->vmm_fd() < 0 || peer_pid_ == getpid()) return;
  std::lock_guard<std::mutex> lock(sock_mu_);
  const uint64_t id = device->vmm_id();
  if (vmm_out_.count(id) != 0) return;
  uint64_t copy = id;
  FdMessage m(&copy, sizeof(copy));
  const int fd = device->vmm_fd();
  m.attach(&fd, 1);
  if (sendmsg(sock_.get(), m.msg(), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(id))) {
    throw_errno(ErrorKind::kConnection, "shm: sending a VMM allocation's fd", errno);
  }
  vmm_out_.insert(id);
}

UniqueFd ShmChannel::take_vmm_fd(uint64_t id) {
  const Deadline deadline(kVmmFdTimeoutS);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(sock_mu_);
      bool open = true;
      for (int pass = 0; pass < 2; ++pass) {
        auto it = vmm_in_.find(id);
        if (it != vmm_in_.end()) {
          UniqueFd fd = std::move(it->second);
          vmm_in_.erase(it);
          return fd;
        }
        if (pass == 0) open = read_socket();
      }
      if (!open) {
        throw Error(ErrorKind::kConnection,
                    "peer " + peer_ + " closed before it sent the fd of its VMM allocation");
      }
    }
    if (deadline.expired()) {
      throw Error(ErrorKind::kTimeout, "shm: the fd of the peer's VMM allocation did not come "
                                       "within " + seconds_text(kVmmFdTimeoutS) + " s");
    }
    pollfd p{sock_.get(), POLLIN, 0};
    poll(&p, 1, 10);
  }
}

}  // namespace rdmaxfer
