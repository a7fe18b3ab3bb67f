// TCP socket helpers shared by the TCP transport and the bootstrap of the verbs transport.
// Every blocking helper takes a Deadline; none waits forever.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common/deadline.h"
#include "common/unique_fd.h"

namespace rdmaxfer {

class TlsContext;
class TlsSession;

// The sockets of a transport's connects that are still in their handshake, so that closing the
// engine ends those connects at once (shutdown() of the socket wakes every wait on it) rather
// than at their deadline.
class PendingConnects {
 public:
  // Shuts down every registered socket; from now on add() refuses.
  void cancel();
  bool cancelled() const;

  // Registers `fd` for its lifetime (made after the fd, so destroyed before it is closed);
  // throws Error(kClosed) once cancel() ran. `pending` may be null (nothing to register).
  class Entry {
   public:
    Entry(PendingConnects* pending, int fd);
    ~Entry();
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;

   private:
    PendingConnects* pending_;
    int fd_;
  };

 private:
  mutable std::mutex mu_;
  std::set<int> fds_;
  bool cancelled_ = false;
};

// Options of the sockets a transport opens (bootstrap and data streams).
struct SocketOptions {
  // SO_SNDBUF/SO_RCVBUF in bytes; 0 keeps the kernel's autotuning (net.ipv4.tcp_rmem/wmem).
  int buffer_bytes = 0;
  // Shared secret for the bootstrap's challenge-response (transport/auth.h); "" = none.
  std::string secret;
  // connect_tcp: retry a refused connection (nothing listens yet) until the deadline.
  bool retry_refused = true;
  // TLS on every stream (transport/tls.h); null = plain.
  std::shared_ptr<const TlsContext> tls;
  // Where bootstrap_connect registers its sockets while they handshake; null = nowhere.
  std::shared_ptr<PendingConnects> pending;
};

// Listening socket bound to host:port (port 0 picks a free one). SO_REUSEADDR, non-blocking.
UniqueFd listen_tcp(const std::string& host, uint16_t port, int backlog);
uint16_t local_port(int fd);
// "HOST:PORT" of the other end, as host_port() writes it ("?" when unknown).
std::string peer_name(int fd);

// "HOST:PORT", with an IPv6 literal in brackets ("[::1]:5555"), so that every address rdmaxfer
// prints parses back as an address argument.
std::string host_port(const std::string& host, unsigned port);

// Connects with a deadline (non-blocking connect + poll); throws kConnection / kTimeout. A
// refused connection is retried with backoff until the deadline when `retry_refused`; each
// retry is logged (DEBUG) and counted in *retries when given; Error(kClosed) after a retry's
// wait once `pending` (when given) is cancelled.
UniqueFd connect_tcp(const std::string& host, uint16_t port, const Deadline& deadline,
                     bool retry_refused, int* retries = nullptr,
                     const PendingConnects* pending = nullptr);

void tune_socket(int fd, const SocketOptions& options);
void set_nonblocking(int fd, bool on);

// Exact-size blocking I/O on a non-blocking socket, bounded by the deadline, through `tls`
// (transport/tls.h) when not null. `what` names the step for the error message; throws
// Error(kConnection) or Error(kTimeout).
void send_exact(int fd, const void* data, size_t size, const Deadline& deadline,
                const char* what, TlsSession* tls = nullptr);
void recv_exact(int fd, void* data, size_t size, const Deadline& deadline, const char* what,
                TlsSession* tls = nullptr);
// Exact-size read without a deadline, for a core thread that reads a control stream until the
// connection ends (shutdown(2) of the socket wakes it): false at the end of the stream or on an
// error, TLS errors included, with the reason in *why.
bool read_stream(int fd, TlsSession* tls, void* data, size_t size, std::string* why);

}  // namespace rdmaxfer
