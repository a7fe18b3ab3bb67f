#include "transport/bootstrap.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/le_codec.h"
#include "common/error.h"
#include "common/interrupt.h"
#include "transport/auth.h"

namespace rdmaxfer {

namespace {
constexpr uint8_t kHelloMagic[4] = {'R', 'X', 'H', 'I'};
constexpr uint8_t kAckMagic[4] = {'R', 'X', 'O', 'K'};

std::string hello_status_text(HelloStatus status) {
  switch (status) {
    case HelloStatus::kOk: return "ok";
    case HelloStatus::kBadRecord: return "the peer could not parse our handshake record";
    case HelloStatus::kTransportMismatch:
      return "the peer runs a different transport (choose the same transport on both sides)";
    case HelloStatus::kRefused: return "the peer refused the connection";
    case HelloStatus::kAuthChallenge: return "the peer asks for authentication";
    case HelloStatus::kAuthFailed:
      return "authentication failed: the peer holds a different secret (set the same "
             "RDMAXFER_SECRET / secret= on both sides)";
    case HelloStatus::kTlsRequired:
      return "the peer requires TLS (tls on there) and this side speaks plain TCP (tls off): "
             "turn TLS on here too (Engine(tls=True) / RDMAXFER_TLS=1, with the same secret or "
             "certificates)";
    case HelloStatus::kTlsOff:
      return "this side requires TLS (tls on) and the peer speaks plain TCP (tls off there): "
             "turn TLS on at the peer too (Engine(tls=True) / RDMAXFER_TLS=1), or off here";
  }
  return "unknown status " + std::to_string(static_cast<int>(status));
}

// What a peer that is not an rdmaxfer engine sent, for a message: its first line, non-printable
// bytes as \xNN, at most kQuoteBytes bytes; and what it looks like (", looks like HTTP").
constexpr size_t kQuoteBytes = 64;

std::string quote_reply(const std::string& bytes) {
  std::string text;
  for (const char c : bytes.substr(0, bytes.find_first_of("\r\n"))) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '"' && c != '\\') {
      text += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", u);
      text += hex;
    }
  }
  std::string guess;
  if (bytes.rfind("HTTP/", 0) == 0) guess = ", looks like HTTP";
  if (bytes.rfind("SSH-", 0) == 0) guess = ", looks like SSH";
  if (bytes.size() >= 2 && (bytes[0] == 0x15 || bytes[0] == 0x16) && bytes[1] == 0x03) {
    guess = ", looks like TLS";
  }
  return "it answered \"" + text + "\"" + guess;
}

// The error for a peer whose reply to our hello starts with `got` instead of kAckMagic: the
// reply quoted, with what else it sent at once (an HTTP server's status line, say).
Error not_an_engine(int fd, std::string got, const std::string& where) {
  const Deadline more(0.1);
  while (got.size() < kQuoteBytes && got.find('\n') == std::string::npos) {
    char buf[kQuoteBytes];
    const ssize_t n = recv(fd, buf, kQuoteBytes - got.size(), MSG_DONTWAIT);
    if (n > 0) {
      got.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, more.remaining_ms()) <= 0) break;
  }
  return Error(ErrorKind::kConnection, "handshake with " + where + ": the peer at " + where +
                                           " is not an rdmaxfer engine (" + quote_reply(got) +
                                           "); check the address and port");
}

// The reply to our hello, or an error that says what the peer did instead: said nothing in
// time, closed the connection, or answered something else (not_an_engine). Read a byte at a
// time until the magic matched, so that a short foreign answer is quoted too.
HelloAck receive_ack(int fd, const Deadline& deadline, const std::string& where) {
  uint8_t buf[HelloAck::kSize];
  size_t got = 0;
  while (got < sizeof(buf)) {
    const size_t want = got < sizeof(kAckMagic) ? 1 : sizeof(buf) - got;
    try {
      recv_exact(fd, buf + got, want, deadline, "handshake: waiting for the reply");
    } catch (const Error& e) {
      // Closed, or reset: closed without reading our hello.
      const bool closed = e.kind() == ErrorKind::kConnection &&
                          (e.err_no() == 0 || e.err_no() == ECONNRESET);
      if (got == 0 && e.kind() == ErrorKind::kTimeout) {
        throw Error(ErrorKind::kTimeout,
                    "handshake with " + where +
                        ": the peer accepted the connection but did not answer rdmaxfer's hello "
                        "within " + seconds_text(deadline.timeout_s()) +
                        " s: it is not an rdmaxfer engine (an HTTP server, for one, waits "
                        "silently for a request) or it is overloaded; check the address and "
                        "port");
      }
      if (got == 0 && closed) {
        throw Error(ErrorKind::kConnection,
                    "handshake with " + where +
                        ": the peer closed the connection without answering rdmaxfer's hello: "
                        "it is not an rdmaxfer engine, or it is shutting down; check the "
                        "address and port");
      }
      if (closed && got < sizeof(kAckMagic)) break;  // a short answer, not ours
      throw;
    }
    got += want;
    if (got <= sizeof(kAckMagic) && buf[got - 1] != kAckMagic[got - 1]) break;
  }
  if (got == sizeof(buf)) return HelloAck::unpack(buf);
  throw not_an_engine(fd, std::string(reinterpret_cast<const char*>(buf), got), where);
}
}  // namespace

void Hello::pack(uint8_t* out) const {
  LeWriter(out, kSize)
      .bytes(kHelloMagic, 4)
      .put<uint16_t>(kVersion)
      .put<uint8_t>(transport)
      .put<uint8_t>(stream_index)
      .put<uint8_t>(n_streams)
      .put<uint8_t>(flags)
      .skip(6)
      .put<uint64_t>(engine_id)
      .put<uint64_t>(conn_id);
}

Hello Hello::unpack(const uint8_t* in) {
  auto bad = [](const std::string& what) {
    throw Error(ErrorKind::kProtocol, "invalid handshake record: " + what);
  };
  LeReader r(in, kSize);
  if (!r.matches(kHelloMagic, 4)) bad("bad magic (not an rdmaxfer peer)");
  const uint16_t version = r.get<uint16_t>();
  if (version != kVersion) {
    bad("unsupported version " + std::to_string(version) + " (this build speaks version " +
        std::to_string(kVersion) + "; upgrade both peers to the same rdmaxfer release)");
  }
  Hello h;
  h.transport = r.get<uint8_t>();
  if (!transport_id_known(h.transport)) bad("unknown transport " + std::to_string(h.transport));
  h.stream_index = r.get<uint8_t>();
  h.n_streams = r.get<uint8_t>();
  if (h.n_streams == 0 || h.n_streams > kMaxStreams) {
    bad("stream count " + std::to_string(h.n_streams) + " outside 1.." +
        std::to_string(kMaxStreams));
  }
  if (h.stream_index >= h.n_streams) {
    bad("stream index " + std::to_string(h.stream_index) + " >= stream count " +
        std::to_string(h.n_streams));
  }
  h.flags = r.get<uint8_t>();
  if ((h.flags & ~(Hello::kFlagHasSecret | Hello::kFlagTls)) != 0) bad("unknown flags");
  if (!r.zeros(6)) bad("reserved bytes are not zero");
  h.engine_id = r.get<uint64_t>();
  h.conn_id = r.get<uint64_t>();
  return h;
}

void HelloAck::pack(uint8_t* out) const {
  LeWriter(out, kSize)
      .bytes(kAckMagic, 4)
      .put<uint16_t>(Hello::kVersion)
      .put<uint16_t>(static_cast<uint16_t>(status))
      .put<uint64_t>(engine_id);
}

HelloAck HelloAck::unpack(const uint8_t* in) {
  LeReader r(in, kSize);
  if (!r.matches(kAckMagic, 4)) {
    throw Error(ErrorKind::kProtocol, "invalid handshake reply: bad magic (not an rdmaxfer peer)");
  }
  r.get<uint16_t>();  // the version: the hello's, checked there
  HelloAck ack;
  ack.status = static_cast<HelloStatus>(r.get<uint16_t>());
  ack.engine_id = r.get<uint64_t>();
  return ack;
}

void check_secret_usable(const SocketOptions& options) {
  if (options.secret.empty()) return;
  const std::string why = auth_unavailable_reason();
  if (!why.empty()) throw Error(ErrorKind::kUnsupported, "cannot use a shared secret: " + why);
}

namespace {

// Client half of the challenge-response (transport/auth.h); throws on any mismatch.
void answer_challenge(int fd, const std::string& secret, const uint8_t* hello,
                      const Deadline& deadline, const std::string& where) {
  Nonce server_nonce{};
  recv_exact(fd, server_nonce.data(), server_nonce.size(), deadline, "handshake: challenge");
  const Digest proof = client_proof(secret, server_nonce, hello, Hello::kSize);
  const Nonce client_nonce = make_nonce();
  uint8_t reply[64];
  std::memcpy(reply, proof.data(), 32);
  std::memcpy(reply + 32, client_nonce.data(), 32);
  send_exact(fd, reply, sizeof(reply), deadline, "handshake: sending the proof");
  uint8_t ack_buf[HelloAck::kSize];
  recv_exact(fd, ack_buf, sizeof(ack_buf), deadline, "handshake: waiting for the verdict");
  HelloAck verdict = HelloAck::unpack(ack_buf);
  if (verdict.status != HelloStatus::kOk) {
    throw Error(ErrorKind::kConnection,
                "handshake with " + where + " failed: " + hello_status_text(verdict.status));
  }
  Digest theirs{};
  recv_exact(fd, theirs.data(), theirs.size(), deadline, "handshake: the peer's proof");
  if (!digests_equal(theirs, server_proof(secret, client_nonce, server_nonce))) {
    throw Error(ErrorKind::kConnection,
                "handshake with " + where +
                    " refused: the peer could not prove it holds the shared secret");
  }
}

// The Hello and the HelloAck as they went in clear before TLS (TlsContext::handshake compares
// them inside it).
std::string clear_records(const uint8_t* hello, const uint8_t* ack) {
  return std::string(reinterpret_cast<const char*>(hello), Hello::kSize) +
         std::string(reinterpret_cast<const char*>(ack), HelloAck::kSize);
}

}  // namespace

uint64_t client_handshake(int fd, Hello hello, const std::string& secret,
                          const Deadline& deadline, const std::string& where,
                          const TlsContext* tls, std::unique_ptr<TlsSession>* session) {
  hello.flags = static_cast<uint8_t>((secret.empty() ? 0 : Hello::kFlagHasSecret) |
                                     (tls != nullptr ? Hello::kFlagTls : 0));
  uint8_t buf[Hello::kSize];
  hello.pack(buf);
  send_exact(fd, buf, sizeof(buf), deadline, ("handshake with " + where + ": sending hello").c_str());
  const HelloAck ack = receive_ack(fd, deadline, where);
  if (tls != nullptr) {
    // kOk: the peer has TLS on too; a challenge: it is a plain engine (of an older build).
    if (ack.status != HelloStatus::kOk) {
      throw Error(ErrorKind::kConnection,
                  "handshake with " + where + " failed: " +
                      hello_status_text(ack.status == HelloStatus::kAuthChallenge
                                            ? HelloStatus::kTlsOff
                                            : ack.status));
    }
    uint8_t ack_buf[HelloAck::kSize];
    ack.pack(ack_buf);
    *session = tls->handshake(fd, false, deadline, where, clear_records(buf, ack_buf));
    return ack.engine_id;
  }
  if (ack.status == HelloStatus::kAuthChallenge) {
    if (secret.empty()) {
      throw Error(ErrorKind::kConnection,
                  "handshake with " + where +
                      " failed: the peer requires authentication; set the same shared secret "
                      "on this side (RDMAXFER_SECRET or secret=)");
    }
    answer_challenge(fd, secret, buf, deadline, where);
  } else if (ack.status != HelloStatus::kOk) {
    throw Error(ErrorKind::kConnection,
                "handshake with " + where + " failed: " + hello_status_text(ack.status));
  } else if (!secret.empty()) {
    throw Error(ErrorKind::kConnection,
                "handshake with " + where +
                    " refused: a secret is configured here but the peer did not authenticate "
                    "(it has no secret); configure the same secret on both sides");
  }
  return ack.engine_id;
}

std::vector<UniqueFd> bootstrap_connect(const std::string& host, uint16_t port,
                                        uint8_t transport, int n_streams,
                                        uint64_t engine_id, uint64_t conn_id,
                                        const SocketOptions& options, const Deadline& deadline,
                                        int* retries, uint64_t* peer_engine_id,
                                        std::vector<std::unique_ptr<TlsSession>>* sessions) {
  if (n_streams < 1 || n_streams > Hello::kMaxStreams) {
    throw Error(ErrorKind::kInvalidArgument,
                "streams=" + std::to_string(n_streams) + " is outside 1.." +
                    std::to_string(Hello::kMaxStreams));
  }
  check_secret_usable(options);
  if (options.tls && sessions == nullptr) {
    throw Error(ErrorKind::kUnsupported, "TLS covers the tcp transport only");
  }
  std::vector<UniqueFd> fds;
  for (int i = 0; i < n_streams; ++i) {
    UniqueFd fd =
        connect_tcp(host, port, deadline, options.retry_refused, retries, options.pending.get());
    tune_socket(fd.get(), options);
    Hello hello;
    hello.transport = transport;
    hello.stream_index = static_cast<uint8_t>(i);
    hello.n_streams = static_cast<uint8_t>(n_streams);
    hello.engine_id = engine_id;
    hello.conn_id = conn_id;
    std::unique_ptr<TlsSession> session;
    const PendingConnects::Entry pending(options.pending.get(), fd.get());
    uint64_t peer = 0;
    try {
      peer = client_handshake(fd.get(), hello, options.secret, deadline, host_port(host, port),
                              options.tls.get(), &session);
    } catch (const Error&) {
      if (options.pending && options.pending->cancelled()) {
        throw Error(ErrorKind::kClosed, "connect to " + host_port(host, port) +
                                            ": the engine was closed during the handshake");
      }
      throw;
    }
    if (peer_engine_id != nullptr) *peer_engine_id = peer;
    fds.push_back(std::move(fd));
    if (session) sessions->push_back(std::move(session));
  }
  return fds;
}

Acceptor::Acceptor(const std::string& host, uint16_t port, uint8_t transport,
                   uint64_t engine_id, SocketOptions options,
                   std::function<void(const std::string&, const std::string&)> on_refused,
                   std::function<void(AcceptedGroup)> on_group)
    : listen_fd_(listen_tcp(host, port, 1024)),
      port_(local_port(listen_fd_.get())),
      transport_(transport),
      engine_id_(engine_id),
      options_(std::move(options)),
      on_refused_(std::move(on_refused)),
      on_group_(std::move(on_group)) {
  check_secret_usable(options_);
  thread_ = std::thread([this] { run(); });
}

Acceptor::~Acceptor() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  handshakes_.stop();
}

std::optional<AcceptedGroup> Acceptor::accept(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!wait_interruptible(cv_, lock, Deadline(timeout_s), [this] { return !ready_.empty(); })) {
    return std::nullopt;
  }
  AcceptedGroup group = std::move(ready_.front());
  ready_.pop_front();
  return group;
}

void Acceptor::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> owners;  // the conn id of each fds[i + 1]
  while (!stop_.load()) {
    const bool full = handshakes_.full();
    fds.clear();
    owners.clear();
    // Every handshake slot taken: new clients wait in the backlog until one ends.
    fds.push_back(pollfd{listen_fd_.get(), static_cast<short>(full ? 0 : POLLIN), 0});
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [conn_id, partial] : partial_) {
        for (const UniqueFd& fd : partial.group.fds) {
          if (!fd.valid()) continue;
          fds.push_back(pollfd{fd.get(), POLLRDHUP, 0});
          owners.push_back(conn_id);
        }
      }
    }
    if (full) {
      // Every slot taken: if a client waits, cut the handshakes that are taking too long.
      pollfd waiting{listen_fd_.get(), POLLIN, 0};
      if (poll(&waiting, 1, 0) > 0 && (waiting.revents & POLLIN) != 0) {
        handshakes_.cut_older_than(kBusyPreAuthS);
      }
    }
    const int rc = poll(fds.data(), fds.size(), full ? 10 : 100);
    expire_partial_groups();
    if (rc <= 0) continue;
    drop_left_groups(fds, owners);
    if ((fds[0].revents & POLLIN) != 0) accept_pending();
  }
}

void Acceptor::accept_pending() {
  while (!handshakes_.full()) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) break;
    UniqueFd conn(fd);
    const std::string peer = peer_name(fd);
    const std::string address = peer.substr(0, peer.rfind(':'));
    {
      std::lock_guard<std::mutex> lock(mu_);
      int& running = handshakes_by_address_[address];
      if (running >= kMaxHandshakesPerAddress) {
        conn.reset();
        on_refused_(peer, "closed at once: " + std::to_string(running) +
                              " handshakes from " + address + " are running already");
        continue;
      }
      ++running;
    }
    try {
      handshakes_.start(std::move(conn), [this, peer, address](UniqueFd accepted) {
        try {
          handshake(std::move(accepted), address);
        } catch (const Error& e) {
          // A peer that sends garbage or stalls loses its own connection, nothing else (and
          // one cut short by the destructor is no refusal).
          if (!stop_.load()) on_refused_(peer, e.what());
        }
        std::lock_guard<std::mutex> lock(mu_);
        if (--handshakes_by_address_[address] == 0) handshakes_by_address_.erase(address);
      });
    } catch (const Error& e) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--handshakes_by_address_[address] == 0) handshakes_by_address_.erase(address);
      }
      on_refused_(peer, e.what());
    }
  }
}

void Acceptor::drop_left_groups(const std::vector<pollfd>& fds,
                                const std::vector<uint64_t>& owners) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 1; i < fds.size(); ++i) {
    if ((fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) continue;
    auto it = partial_.find(owners[i - 1]);
    if (it == partial_.end()) continue;
    // The descriptor may have been closed and reused since the poll: drop only the group that
    // still holds it.
    for (const UniqueFd& fd : it->second.group.fds) {
      if (fd.get() == fds[i].fd) {
        partial_.erase(it);
        break;
      }
    }
  }
}

void Acceptor::bound_partial_locked(const std::string& address) {
  for (;;) {
    size_t mine = 0;
    auto oldest = partial_.end();
    auto oldest_mine = partial_.end();
    for (auto it = partial_.begin(); it != partial_.end(); ++it) {
      if (oldest == partial_.end() || it->second.order < oldest->second.order) oldest = it;
      if (it->second.address != address) continue;
      ++mine;
      if (oldest_mine == partial_.end() || it->second.order < oldest_mine->second.order) {
        oldest_mine = it;
      }
    }
    if (mine >= kMaxPartialPerAddress) {
      partial_.erase(oldest_mine);
    } else if (partial_.size() >= kMaxPartial) {
      partial_.erase(oldest);
    } else {
      return;
    }
  }
}

Hello server_handshake(int fd, uint8_t transport, uint64_t engine_id, const std::string& secret,
                       const TlsContext* tls, std::unique_ptr<TlsSession>* session) {
  Deadline deadline(kPreAuthTimeoutS);
  uint8_t buf[Hello::kSize];
  recv_exact(fd, buf, sizeof(buf), deadline,
             ("handshake with " + peer_name(fd) + ": waiting for hello").c_str());
  HelloAck ack;
  ack.engine_id = engine_id;
  Hello hello;
  try {
    hello = Hello::unpack(buf);
  } catch (const Error&) {
    ack.status = HelloStatus::kBadRecord;
  }
  if (ack.status == HelloStatus::kOk && hello.transport != transport) {
    ack.status = HelloStatus::kTransportMismatch;
  }
  const bool peer_tls = (hello.flags & Hello::kFlagTls) != 0;
  if (ack.status == HelloStatus::kOk && peer_tls != (tls != nullptr)) {
    ack.status = tls != nullptr ? HelloStatus::kTlsRequired : HelloStatus::kTlsOff;
  }
  uint8_t ack_buf[HelloAck::kSize];
  if (ack.status == HelloStatus::kOk && tls != nullptr) {
    // TLS authenticates (the secret as its pre-shared key, or certificates): no challenge.
    ack.pack(ack_buf);
    send_exact(fd, ack_buf, sizeof(ack_buf), deadline, "handshake: replying");
    *session = tls->handshake(fd, true, deadline, peer_name(fd), clear_records(buf, ack_buf));
  } else if (ack.status == HelloStatus::kOk && !secret.empty()) {
    // Challenge before anything else is revealed (transport/auth.h).
    ack.status = HelloStatus::kAuthChallenge;
    ack.pack(ack_buf);
    const Nonce server_nonce = make_nonce();
    uint8_t reply[64];
    try {
      send_exact(fd, ack_buf, sizeof(ack_buf), deadline, "handshake: challenge");
      send_exact(fd, server_nonce.data(), server_nonce.size(), deadline, "handshake: challenge");
      recv_exact(fd, reply, sizeof(reply), deadline, "handshake: waiting for the proof");
    } catch (const Error& e) {
      // The peer has no secret: it hangs up at the challenge, seen as a broken pipe when it
      // closed before the nonce went out, else as the end of the stream or (the nonce unread)
      // a reset.
      const int err = e.err_no();
      if (e.kind() != ErrorKind::kConnection || (err != 0 && err != ECONNRESET && err != EPIPE)) {
        throw;
      }
      throw Error(ErrorKind::kConnection,
                  "authentication failed: the peer hung up at the challenge, as one without "
                  "the shared secret does (set the same RDMAXFER_SECRET / secret= on both "
                  "sides)");
    }
    Digest proof{};
    Nonce client_nonce{};
    std::memcpy(proof.data(), reply, 32);
    std::memcpy(client_nonce.data(), reply + 32, 32);
    const bool ok = digests_equal(proof, client_proof(secret, server_nonce, buf, Hello::kSize));
    ack.status = ok ? HelloStatus::kOk : HelloStatus::kAuthFailed;
    ack.pack(ack_buf);
    send_exact(fd, ack_buf, sizeof(ack_buf), deadline, "handshake: verdict");
    if (!ok) throw Error(ErrorKind::kConnection, hello_status_text(ack.status));
    const Digest mine = server_proof(secret, client_nonce, server_nonce);
    send_exact(fd, mine.data(), mine.size(), deadline, "handshake: our proof");
  } else {
    ack.pack(ack_buf);
    send_exact(fd, ack_buf, sizeof(ack_buf), deadline, "handshake: replying");
    if (ack.status == HelloStatus::kTlsRequired || ack.status == HelloStatus::kTlsOff) {
      // Said from this side: the statuses' texts speak from the client's.
      throw Error(ErrorKind::kConnection,
                  ack.status == HelloStatus::kTlsRequired
                      ? "this engine requires TLS (tls on) and the peer speaks plain TCP (tls "
                        "off there): turn TLS on at the peer too (RDMAXFER_TLS=1)"
                      : "the peer asked for TLS (tls on there) and this engine has tls off: "
                        "turn TLS on here too (Engine(tls=True) / RDMAXFER_TLS=1), or off at "
                        "the peer");
    }
    if (ack.status != HelloStatus::kOk) {
      throw Error(ErrorKind::kConnection, hello_status_text(ack.status));
    }
  }
  return hello;
}

void Acceptor::handshake(UniqueFd fd, const std::string& address) {
  std::unique_ptr<TlsSession> session;
  const Hello hello = server_handshake(fd.get(), transport_, engine_id_, options_.secret,
                                       options_.tls.get(), &session);
  tune_socket(fd.get(), options_);

  std::string peer = peer_name(fd.get());
  std::unique_lock<std::mutex> lock(mu_);
  if (hello.n_streams > 1 && partial_.count(hello.conn_id) == 0) bound_partial_locked(address);
  Partial& partial = partial_[hello.conn_id];
  if (partial.group.fds.empty()) {
    partial.group.hello = hello;
    partial.group.fds.resize(hello.n_streams);
    if (session) partial.group.tls.resize(hello.n_streams);
    partial.group.peer = peer;
    partial.address = address;
    partial.order = partial_order_++;
  }
  if (partial.group.hello.n_streams != hello.n_streams ||
      partial.group.fds[hello.stream_index].valid()) {
    partial_.erase(hello.conn_id);  // inconsistent streams: drop the whole connection
    return;
  }
  partial.group.fds[hello.stream_index] = std::move(fd);
  if (session) partial.group.tls[hello.stream_index] = std::move(session);
  if (++partial.arrived < hello.n_streams) return;
  AcceptedGroup group = std::move(partial.group);
  partial_.erase(hello.conn_id);
  if (!on_group_) {
    ready_.push_back(std::move(group));
    cv_.notify_all();
    return;
  }
  lock.unlock();
  on_group_(std::move(group));
}

void Acceptor::expire_partial_groups() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = partial_.begin(); it != partial_.end();) {
    it = it->second.deadline.expired() ? partial_.erase(it) : std::next(it);
  }
}

}  // namespace rdmaxfer
