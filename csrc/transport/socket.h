// TCP socket helpers shared by the TCP transport and the bootstrap of the verbs transport.
// Every blocking helper takes a Deadline; none waits forever.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/deadline.h"
#include "common/unique_fd.h"

namespace rdmaxfer {

// Options of the sockets a transport opens (bootstrap and data streams).
class TlsContext;
class TlsSession;

struct SocketOptions {
  // SO_SNDBUF/SO_RCVBUF in bytes; 0 keeps the kernel's autotuning (net.ipv4.tcp_rmem/wmem).
  int buffer_bytes = 0;
  // Shared secret for the bootstrap's challenge-response (transport/auth.h); "" = none.
  std::string secret;
  // connect_tcp: retry a refused connection (nothing listens yet) until the deadline.
  bool retry_refused = true;
  // TLS on every stream (transport/tls.h); null = plain.
  std::shared_ptr<const TlsContext> tls;
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
// retry is logged (DEBUG) and counted in *retries when given.
UniqueFd connect_tcp(const std::string& host, uint16_t port, const Deadline& deadline,
                     bool retry_refused, int* retries = nullptr);

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
