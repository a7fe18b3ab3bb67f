#include "transport/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "common/error.h"
#include "common/interrupt.h"
#include "common/log.h"
#include "transport/tls.h"

namespace rdmaxfer {

namespace {

// Backoff between connection attempts that were refused: doubling from kFirstRetryS to kMaxRetryS.
constexpr double kFirstRetryS = 0.05;
constexpr double kMaxRetryS = 1.0;

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoPtr resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* out = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out);
  if (rc != 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "cannot resolve host '" + host + "': " + gai_strerror(rc) +
                    "; pass an IP address or a resolvable host name");
  }
  return AddrInfoPtr(out);
}

// Waits in slices, so that an interrupt (Ctrl-C) ends the wait (common/interrupt.h).
void wait_fd(int fd, short events, const Deadline& deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, deadline.remaining_ms(kInterruptSliceMs));
    if (rc > 0) return;
    if (rc < 0 && errno != EINTR) {
      throw_errno(ErrorKind::kTransport, std::string(what) + ": poll", errno);
    }
    if (deadline.expired()) {
      throw Error(ErrorKind::kTimeout, std::string(what) + ": no answer within " +
                                           seconds_text(deadline.timeout_s()) + " s");
    }
    poll_interrupt();
  }
}

// One attempt over every address of host; returns the socket or an invalid fd and sets
// `refused` when every address refused (nothing listens yet), `last_error` otherwise.
UniqueFd try_connect(const addrinfo* ai, const Deadline& deadline, bool* refused,
                     std::string* last_error) {
  *refused = true;
  for (const addrinfo* a = ai; a != nullptr; a = a->ai_next) {
    UniqueFd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
      *last_error = errno_text("socket", errno);
      *refused = false;
      continue;
    }
    set_nonblocking(fd.get(), true);
    int err = connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      wait_fd(fd.get(), POLLOUT, deadline, "connect");
      socklen_t len = sizeof(err);
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) return fd;
    *last_error = errno_text("connect", err);
    *refused = *refused && err == ECONNREFUSED;
  }
  return UniqueFd();
}


}  // namespace

UniqueFd listen_tcp(const std::string& host, uint16_t port, int backlog) {
  AddrInfoPtr ai = resolve(host, port, true);
  int last_errno = 0;
  for (addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    UniqueFd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
      last_errno = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || listen(fd.get(), backlog) != 0) {
      last_errno = errno;
      continue;
    }
    set_nonblocking(fd.get(), true);
    return fd;
  }
  std::string what = "listen on " + host_port(host, port);
  if (last_errno == EADDRINUSE) {
    what += " (the port is in use: port 0 picks a free one, port=0 in Python, --port 0 for the "
            "rdmaxfer command)";
  }
  throw_errno(ErrorKind::kTransport, what, last_errno);
}

uint16_t local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) throw_errno("getsockname");
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  if (ss.ss_family == AF_UNIX) return "a process of this host";  // the shm transport's socket
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return host_port(host, static_cast<unsigned>(std::stoul(serv)));
}

std::string host_port(const std::string& host, unsigned port) {
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

UniqueFd connect_tcp(const std::string& host, uint16_t port, const Deadline& deadline,
                     bool retry_refused, int* retries, const PendingConnects* pending) {
  AddrInfoPtr ai = resolve(host, port, false);
  const auto started = Deadline::Clock::now();
  std::string last_error = "no address";
  double backoff_s = kFirstRetryS;
  int attempts = 0;
  for (;;) {
    bool refused = false;
    ++attempts;
    UniqueFd fd = try_connect(ai.get(), deadline, &refused, &last_error);
    if (fd.valid()) return fd;
    // Refused: the peer may not listen yet (started a moment later). Retry with backoff until
    // the deadline, as torch.distributed's TCPStore does.
    if (!refused || !retry_refused || deadline.expired()) break;
    if (retries != nullptr) ++*retries;
    if (log::enabled(log::Level::kDebug)) {
      log::write(log::Level::kDebug, "connect to " + host_port(host, port) + ": " + last_error +
                                         "; retrying in " + seconds_text(backoff_s) + " s");
    }
    sleep_interruptible(backoff_s, deadline);
    if (pending != nullptr && pending->cancelled()) {
      throw Error(ErrorKind::kClosed,
                  "connect to " + host_port(host, port) + ": the engine was closed while retrying");
    }
    backoff_s = std::min(backoff_s * 2, kMaxRetryS);
  }
  const double tried_s =
      std::chrono::duration<double>(Deadline::Clock::now() - started).count();
  throw Error(ErrorKind::kConnection,
              "cannot connect to " + host_port(host, port) + ": " + last_error + " (" +
                  std::to_string(attempts) + (attempts == 1 ? " attempt" : " attempts") +
                  " over " + seconds_text(tried_s) +
                  " s; is the peer listening on that address and port?)");
}

void PendingConnects::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
}

bool PendingConnects::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

PendingConnects::Entry::Entry(PendingConnects* pending, int fd) : pending_(pending), fd_(fd) {
  if (pending_ == nullptr) return;
  std::lock_guard<std::mutex> lock(pending_->mu_);
  if (pending_->cancelled_) throw Error(ErrorKind::kClosed, "the engine is closed");
  pending_->fds_.insert(fd_);
}

PendingConnects::Entry::~Entry() {
  if (pending_ == nullptr) return;
  std::lock_guard<std::mutex> lock(pending_->mu_);
  pending_->fds_.erase(fd_);
}

void tune_socket(int fd, const SocketOptions& options) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    throw_errno("setsockopt(TCP_NODELAY)");
  }
  if (options.buffer_bytes > 0) {
    int size = options.buffer_bytes;
    // The kernel caps these at net.core.wmem_max/rmem_max; a capped value is not an error.
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
  }
}

void set_nonblocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) throw_errno("fcntl(F_GETFL)");
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) != 0) throw_errno("fcntl(F_SETFL)");
}

namespace {
// One non-blocking send or receive, through `tls` when not null (like send/recv with
// MSG_DONTWAIT; a TLS error throws Error(kConnection)).
ssize_t send_some(int fd, TlsSession* tls, const uint8_t* p, size_t size) {
  if (tls == nullptr) return send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
  iovec iov{const_cast<uint8_t*>(p), size};
  return tls->writev(&iov, 1);
}

ssize_t recv_some(int fd, TlsSession* tls, uint8_t* p, size_t size) {
  return tls == nullptr ? recv(fd, p, size, MSG_DONTWAIT) : tls->read(p, size);
}
}  // namespace

void send_exact(int fd, const void* data, size_t size, const Deadline& deadline,
                const char* what, TlsSession* tls) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    ssize_t n = send_some(fd, tls, p, size);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      wait_fd(fd, POLLOUT, deadline, what);
    } else if (n < 0 && errno != EINTR) {
      throw_errno(ErrorKind::kConnection, what, errno);
    }
  }
}

void recv_exact(int fd, void* data, size_t size, const Deadline& deadline, const char* what,
                TlsSession* tls) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    ssize_t n = recv_some(fd, tls, p, size);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
    } else if (n == 0) {
      throw Error(ErrorKind::kConnection, std::string(what) + ": peer closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_fd(fd, POLLIN, deadline, what);
    } else if (errno != EINTR) {
      throw_errno(ErrorKind::kConnection, what, errno);
    }
  }
}

bool read_stream(int fd, TlsSession* tls, void* data, size_t size, std::string* why) {
  auto* p = static_cast<uint8_t*>(data);
  try {
    while (size > 0) {
      const ssize_t n = recv_some(fd, tls, p, size);
      if (n > 0) {
        p += n;
        size -= static_cast<size_t>(n);
      } else if (n == 0) {
        *why = "closed its connection";
        return false;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd w{fd, POLLIN, 0};
        if (poll(&w, 1, -1) < 0 && errno != EINTR) {
          *why = errno_text("poll", errno);
          return false;
        }
      } else if (errno != EINTR) {
        *why = errno_text("recv", errno);
        return false;
      }
    }
  } catch (const Error& e) {  // a TLS record that failed authentication, or a TLS alert
    *why = std::string("sent what TLS refused: ") + e.what();
    return false;
  }
  return true;
}

}  // namespace rdmaxfer
