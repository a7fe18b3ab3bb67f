// Bootstrap: the handshake every connection starts with, whatever the data transport (over TCP;
// the shm transport runs the same halves over its UNIX socket).
//
// A connection is one or more TCP streams. Each stream opens with a Hello record and the
// acceptor answers each with a HelloAck. The acceptor groups streams by conn_id and hands a
// connection over once all of its `n_streams` streams have arrived.
//
// Hello, 32 bytes, little-endian, version 1:
//   0 magic "RXHI"  4 version u16  6 transport u8  7 stream_index u8  8 n_streams u8
//   9 flags u8 (bit 0: the client holds a secret, bit 1: it speaks TLS)  10 reserved (6 bytes, 0)
//  16 engine_id u64  24 conn_id u64
// HelloAck, 16 bytes: 0 magic "RXOK"  4 version u16  6 status u16  8 engine_id u64
// When the acceptor has a secret, the Hello is answered by the challenge-response of
// transport/auth.h before the stream is accepted; a client with a secret refuses an acceptor
// that does not challenge it. When both sides have TLS on (transport/tls.h), the HelloAck is
// followed by a TLS 1.3 handshake on the stream instead (the secret is its pre-shared key), and
// everything after it travels inside TLS; a side with TLS on refuses a peer without it, and
// the other way round, each naming the setting.
#pragma once

#include <poll.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "core/descriptor.h"
#include "transport/handshake_pool.h"
#include "transport/socket.h"
#include "transport/tls.h"

namespace rdmaxfer {

struct Hello {
  static constexpr size_t kSize = 32;
  static constexpr uint16_t kVersion = 1;
  static constexpr int kMaxStreams = 64;
  static constexpr uint8_t kFlagHasSecret = 1;
  static constexpr uint8_t kFlagTls = 2;
  uint8_t transport = 0;  // the wire id of the transport (core/transport_ids.h)
  uint8_t stream_index = 0;
  uint8_t n_streams = 1;
  uint8_t flags = 0;
  uint64_t engine_id = 0;
  uint64_t conn_id = 0;

  void pack(uint8_t* out) const;
  static Hello unpack(const uint8_t* in);  // throws Error(kProtocol)
};

enum class HelloStatus : uint16_t {
  kOk = 0,
  kBadRecord = 1,
  kTransportMismatch = 2,
  kRefused = 3,
  kAuthChallenge = 4,  // a 32-byte nonce follows; answer with the proof (transport/auth.h)
  kAuthFailed = 5,
  kTlsRequired = 6,  // the acceptor has TLS on, the client has not
  kTlsOff = 7,       // the client asked for TLS, the acceptor has it off
};

struct HelloAck {
  static constexpr size_t kSize = 16;
  HelloStatus status = HelloStatus::kOk;
  uint64_t engine_id = 0;
  void pack(uint8_t* out) const;
  static HelloAck unpack(const uint8_t* in);  // throws Error(kProtocol)
};

// The streams of one accepted connection, in stream_index order.
struct AcceptedGroup {
  Hello hello;
  std::vector<UniqueFd> fds;
  std::vector<std::unique_ptr<TlsSession>> tls;  // each stream's TLS session (TLS on), else empty
  std::string peer;
};

// Throws Error(kUnsupported) when a secret is set but HMAC is unusable here (auth.h).
void check_secret_usable(const SocketOptions& options);

// The client half of the handshake on one connected stream (TCP or UNIX): sends `hello` (its
// flags set from `secret` and `tls`), answers the acceptor's challenge when it has a secret, or
// with `tls` runs the TLS handshake and sets *session; returns the acceptor's engine id; throws
// Error(kConnection) naming `where` and the reason when refused.
uint64_t client_handshake(int fd, Hello hello, const std::string& secret, const Deadline& deadline,
                          const std::string& where, const TlsContext* tls = nullptr,
                          std::unique_ptr<TlsSession>* session = nullptr);

// The acceptor's half: reads the Hello, checks its transport and TLS flag, challenges with
// `secret` when set, or with `tls` runs the TLS handshake and sets *session (the whole exchange
// bounded by kPreAuthTimeoutS from the call on); returns the Hello, or throws
// Error(kConnection) with the reason the peer was refused (the peer was told).
constexpr double kPreAuthTimeoutS = 2.0;
Hello server_handshake(int fd, uint8_t transport, uint64_t engine_id, const std::string& secret,
                       const TlsContext* tls = nullptr,
                       std::unique_ptr<TlsSession>* session = nullptr);

// Opens `n_streams` TCP streams to host:port and performs the handshake on each; counts
// refused, retried connection attempts in *retries (connect_tcp); sets *peer_engine_id (when
// not null) to the acceptor's engine id; with options.tls, each stream's TLS session goes
// into *sessions (required then).
std::vector<UniqueFd> bootstrap_connect(const std::string& host, uint16_t port,
                                        uint8_t transport, int n_streams,
                                        uint64_t engine_id, uint64_t conn_id,
                                        const SocketOptions& options, const Deadline& deadline,
                                        int* retries, uint64_t* peer_engine_id = nullptr,
                                        std::vector<std::unique_ptr<TlsSession>>* sessions =
                                            nullptr);

// Listens on its own thread and runs each stream's handshake on a thread of its own
// (handshake_pool.h), each bounded by kPreAuthTimeoutS, so a client that stalls delays
// neither another client nor the destructor (which cuts the handshakes still running).
// accept() hands out complete groups, or `on_group` takes them.
//
// What a stranger can hold (before authentication, and in groups that never complete): at
// most kMaxHandshakesPerAddress handshakes per source address (one more is closed at once),
// each a socket, a thread and a few hundred bytes for at most kPreAuthTimeoutS (only
// kBusyPreAuthS while every slot is taken and a client waits in the backlog); and at most
// kMaxPartialPerAddress incomplete stream groups per address (kMaxPartial in all; beyond,
// the oldest is dropped), each released the moment one of its streams hangs up, else after
// kPartialGroupTimeoutS.
class Acceptor {
 public:
  // Handshakes running at once; further clients wait in the listen backlog.
  static constexpr int kMaxHandshakes = 256;
  static constexpr int kMaxHandshakesPerAddress = 64;
  // While every handshake slot is taken and a client waits in the backlog, a handshake still
  // running after this long is cut (seconds): strangers from many addresses that stall in
  // their handshakes cannot keep a client out for the whole kPreAuthTimeoutS.
  static constexpr double kBusyPreAuthS = 0.5;
  static constexpr size_t kMaxPartial = 1024;
  static constexpr size_t kMaxPartialPerAddress = 64;
  static constexpr double kPartialGroupTimeoutS = 10.0;
  // `on_refused(peer, cause)`: called on a handshake thread for a peer whose handshake failed
  // (the transport logs and counts it). `on_group`, when set, receives each complete group on
  // the handshake thread of its last stream (to finish a transport's own handshake there, in
  // parallel too), instead of accept().
  Acceptor(const std::string& host, uint16_t port, uint8_t transport, uint64_t engine_id,
           SocketOptions options,
           std::function<void(const std::string&, const std::string&)> on_refused,
           std::function<void(AcceptedGroup)> on_group = nullptr);
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;
  ~Acceptor();
  uint16_t port() const { return port_; }
  // The next complete group; none when no connection completes in time.
  std::optional<AcceptedGroup> accept(double timeout_s);

 private:
  void run();
  // Accepts what waits in the backlog while a handshake slot is free.
  void accept_pending();
  void handshake(UniqueFd fd, const std::string& address);
  void expire_partial_groups();
  // Drops the incomplete groups a stream of which hung up (`fds`: polled for POLLRDHUP, their
  // groups' conn ids in `owners`).
  void drop_left_groups(const std::vector<pollfd>& fds, const std::vector<uint64_t>& owners);
  // Makes room for one more incomplete group of `address` (mu_ held).
  void bound_partial_locked(const std::string& address);

  UniqueFd listen_fd_;
  uint16_t port_;
  uint8_t transport_;
  uint64_t engine_id_;
  SocketOptions options_;
  std::function<void(const std::string&, const std::string&)> on_refused_;
  std::function<void(AcceptedGroup)> on_group_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<AcceptedGroup> ready_;
  struct Partial {
    AcceptedGroup group;
    std::string address;  // the peer's address, without the port
    uint64_t order = 0;   // arrival order: the lowest is dropped first
    int arrived = 0;
    Deadline deadline{kPartialGroupTimeoutS};
  };
  std::map<uint64_t, Partial> partial_;
  uint64_t partial_order_ = 0;
  std::map<std::string, int> handshakes_by_address_;  // handshakes running, by peer address
  HandshakePool handshakes_{kMaxHandshakes};
  std::thread thread_;
};

}  // namespace rdmaxfer
