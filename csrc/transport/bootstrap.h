// Bootstrap: the handshake every connection starts with, whatever the data transport (over TCP;
// the shm transport runs the same halves over its UNIX socket).
//
// A connection is one or more TCP streams. Each stream opens with a Hello record and the
// acceptor answers each with a HelloAck. The acceptor groups streams by conn_id and hands a
// connection over once all of its `n_streams` streams have arrived.
//
// Hello, 32 bytes, little-endian, version 1:
//   0 magic "RXHI"  4 version u16  6 transport u8  7 stream_index u8  8 n_streams u8
//   9 flags u8 (bit 0: the client holds a secret)  10 reserved (6 bytes, 0)
//  16 engine_id u64  24 conn_id u64
// HelloAck, 16 bytes: 0 magic "RXOK"  4 version u16  6 status u16  8 engine_id u64
// When the acceptor has a secret, the Hello is answered by the challenge-response of
// transport/auth.h before the stream is accepted; a client with a secret refuses an acceptor
// that does not challenge it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "core/descriptor.h"
#include "transport/handshake_pool.h"
#include "transport/socket.h"

namespace rdmaxfer {

struct Hello {
  static constexpr size_t kSize = 32;
  static constexpr uint16_t kVersion = 1;
  static constexpr int kMaxStreams = 64;
  static constexpr uint8_t kFlagHasSecret = 1;
  TransportKind transport = TransportKind::kTcp;
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
  std::string peer;
};

// Throws Error(kUnsupported) when a secret is set but HMAC is unusable here (auth.h).
void check_secret_usable(const SocketOptions& options);

// The client half of the handshake on one connected stream (TCP or UNIX): sends `hello` (its
// flags set from `secret`), answers the acceptor's challenge when it has a secret; throws
// Error(kConnection) naming `where` and the reason when refused.
void client_handshake(int fd, Hello hello, const std::string& secret, const Deadline& deadline,
                      const std::string& where);

// The acceptor's half: reads the Hello, checks its transport, challenges with `secret` when set
// (bounded by the handshake timeout); returns the Hello, or throws Error(kConnection) with the
// reason the peer was refused (the peer was told).
Hello server_handshake(int fd, TransportKind transport, uint64_t engine_id,
                       const std::string& secret);

// Opens `n_streams` TCP streams to host:port and performs the handshake on each; counts
// refused, retried connection attempts in *retries (connect_tcp).
std::vector<UniqueFd> bootstrap_connect(const std::string& host, uint16_t port,
                                        TransportKind transport, int n_streams,
                                        uint64_t engine_id, uint64_t conn_id,
                                        const SocketOptions& options, const Deadline& deadline,
                                        int* retries);

// Listens on its own thread and runs each stream's handshake on a thread of its own
// (handshake_pool.h), each bounded by the handshake timeout, so a client that stalls delays
// neither another client nor the destructor (which cuts the handshakes still running).
// accept() hands out complete groups, or `on_group` takes them.
class Acceptor {
 public:
  // Handshakes running at once; further clients wait in the listen backlog.
  static constexpr int kMaxHandshakes = 256;
  // `on_refused(peer, cause)`: called on a handshake thread for a peer whose handshake failed
  // (the transport logs and counts it). `on_group`, when set, receives each complete group on
  // the handshake thread of its last stream (to finish a transport's own handshake there, in
  // parallel too), instead of accept().
  Acceptor(const std::string& host, uint16_t port, TransportKind transport, uint64_t engine_id,
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
  void handshake(UniqueFd fd);
  void expire_partial_groups();

  UniqueFd listen_fd_;
  uint16_t port_;
  TransportKind transport_;
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
    int arrived = 0;
    Deadline deadline{10.0};
  };
  std::map<uint64_t, Partial> partial_;
  HandshakePool handshakes_{kMaxHandshakes};
  std::thread thread_;
};

}  // namespace rdmaxfer
