// ShmChannel::establish: the shm set-up after the Hello/auth handshake (shm_channel.h).
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/auth.h"
#include "transport/shm/cma_copy.h"
#include "transport/shm/fd_message.h"
#include "transport/shm/same_host.h"
#include "transport/shm/shm_channel.h"
#include "transport/shm/shm_transport.h"
#include "transport/socket.h"

namespace rdmaxfer {

namespace {

// What each side announces with its ring's memfd and doorbell.
struct RingOffer {
  uint64_t capacity = 0;
  uint64_t probe_addr = 0;  // 32 bytes the peer reads with process_vm_readv
};

void wait_ready(int fd, short events, const Deadline& deadline, const char* what) {
  pollfd p{fd, events, 0};
  const int rc = poll(&p, 1, deadline.remaining_ms());
  if (rc < 0 && errno != EINTR) throw_errno(ErrorKind::kConnection, what, errno);
  if (rc == 0) {
    throw Error(ErrorKind::kTimeout, std::string(what) + ": no answer within " +
                                         seconds_text(deadline.timeout_s()) + " s");
  }
}

void send_offer(int sock, const RingOffer& offer, int memfd, int doorbell,
                const Deadline& deadline) {
  RingOffer copy = offer;
  FdMessage m(&copy, sizeof(copy));
  const int fds[2] = {memfd, doorbell};
  m.attach(fds, 2);
  for (;;) {
    const ssize_t n = sendmsg(sock, m.msg(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(sizeof(offer))) return;
    if (n >= 0) throw Error(ErrorKind::kConnection, "shm handshake: short sendmsg");
    if (errno == EAGAIN || errno == EINTR) {
      wait_ready(sock, POLLOUT, deadline, "shm handshake: sending the ring");
      continue;
    }
    throw_errno(ErrorKind::kConnection, "shm handshake: sendmsg(SCM_RIGHTS)", errno);
  }
}

RingOffer recv_offer(int sock, UniqueFd* memfd, UniqueFd* doorbell, const Deadline& deadline) {
  RingOffer offer;
  FdMessage m(&offer, sizeof(offer));
  ssize_t n = 0;
  for (;;) {
    n = recvmsg(sock, m.msg(), MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n >= 0) break;
    if (errno == EAGAIN || errno == EINTR) {
      wait_ready(sock, POLLIN, deadline, "shm handshake: waiting for the peer's ring");
      continue;
    }
    throw_errno(ErrorKind::kConnection, "shm handshake: recvmsg(SCM_RIGHTS)", errno);
  }
  UniqueFd fds[2];
  const bool two = m.take(fds, 2);
  if (n == 0) throw Error(ErrorKind::kConnection, "shm handshake: the peer closed the socket");
  if (n != static_cast<ssize_t>(sizeof(offer)) || !two || (m.flags() & MSG_TRUNC) != 0) {
    throw Error(ErrorKind::kProtocol, "shm handshake: malformed ring offer");
  }
  *memfd = std::move(fds[0]);
  *doorbell = std::move(fds[1]);
  struct stat st{};
  if (fstat(memfd->get(), &st) != 0) throw_errno(ErrorKind::kTransport, "shm: fstat", errno);
  if (offer.capacity != ShmChannel::kRingBytes ||
      static_cast<uint64_t>(st.st_size) != ShmRing::kHeaderBytes + offer.capacity) {
    throw Error(ErrorKind::kProtocol, "shm handshake: the peer's ring has an unexpected size");
  }
  return offer;
}

void send_record(int sock, const std::string& text, const Deadline& deadline) {
  const uint32_t len = static_cast<uint32_t>(text.size());
  send_exact(sock, &len, sizeof(len), deadline, "shm handshake: sending");
  send_exact(sock, text.data(), text.size(), deadline, "shm handshake: sending");
}

std::string recv_record(int sock, const Deadline& deadline) {
  uint32_t len = 0;
  recv_exact(sock, &len, sizeof(len), deadline, "shm handshake: receiving");
  if (len > 4096) throw Error(ErrorKind::kProtocol, "shm handshake: oversized record");
  std::string text(len, '\0');
  if (len > 0) recv_exact(sock, &text[0], len, deadline, "shm handshake: receiving");
  return text;
}

}  // namespace

std::shared_ptr<ShmChannel> ShmChannel::establish(ShmTransport& transport, UniqueFd sock,
                                                  std::string peer, const Deadline& deadline) {
  const int fd = sock.get();
  // 1. One host, one network and PID namespace, one user.
  const HostIdentity mine = HostIdentity::local();
  send_record(fd, mine.pack(), deadline);
  const HostIdentity theirs = HostIdentity::unpack(recv_record(fd, deadline));
  ucred cred{};
  socklen_t cred_len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) {
    throw_errno(ErrorKind::kTransport, "shm: getsockopt(SO_PEERCRED)", errno);
  }
  const std::string mismatch = same_host_mismatch(mine, theirs, cred.pid);
  if (!mismatch.empty()) {
    throw Error(ErrorKind::kUnsupported, "shm: cannot connect to " + peer + ": " + mismatch);
  }
  // 2. Each side makes the ring it reads and sends it with its doorbell.
  UniqueFd my_memfd = ShmRing::create(kRingBytes);
  UniqueFd my_bell(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!my_bell.valid()) throw_errno(ErrorKind::kTransport, "shm: eventfd", errno);
  const Nonce probe = make_nonce();
  RingOffer offer;
  offer.capacity = kRingBytes;
  offer.probe_addr = reinterpret_cast<uint64_t>(probe.data());
  send_offer(fd, offer, my_memfd.get(), my_bell.get(), deadline);
  UniqueFd their_memfd;
  UniqueFd their_bell;
  const RingOffer their_offer = recv_offer(fd, &their_memfd, &their_bell, deadline);
  // 3. CMA both ways: each reads the other's probe and sends back what it read.
  Nonce read_back{};
  const int err =
      cma_copy(cred.pid, CmaDirection::kPull, read_back.data(), their_offer.probe_addr, 32);
  std::string answer(read_back.begin(), read_back.end());
  answer += std::to_string(err);
  send_record(fd, answer, deadline);
  const std::string verdict = recv_record(fd, deadline);
  if (err != 0) {
    throw Error(ErrorKind::kUnsupported,
                "shm: cannot connect to " + peer + ": " +
                    errno_text("process_vm_readv of the peer (CMA)", err) +
                    (yama_ptrace_scope() > 0
                         ? "; Yama ptrace_scope is " + std::to_string(yama_ptrace_scope()) +
                               " (/proc/sys/kernel/yama/ptrace_scope): it needs 0"
                         : "") +
                    "; use transport='tcp'");
  }
  if (verdict.size() < probe.size() ||
      std::memcmp(verdict.data(), probe.data(), probe.size()) != 0) {
    throw Error(ErrorKind::kUnsupported,
                "shm: cannot connect to " + peer +
                    ": the peer cannot read this process with process_vm_readv (CMA); use "
                    "transport='tcp'");
  }
  auto channel = std::make_shared<ShmChannel>(transport, std::move(sock), std::move(peer),
                                              cred.pid);
  channel->in_ = std::make_unique<ShmRing>(my_memfd.get(), kRingBytes, std::move(my_bell));
  channel->out_ = std::make_unique<ShmRing>(their_memfd.get(), kRingBytes, std::move(their_bell));
  return channel;
}

}  // namespace rdmaxfer
