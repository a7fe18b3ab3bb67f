#include "transport/tls.h"

#include <dlfcn.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>

#include "common/error.h"
#include "common/log.h"
#include "common/unique_fd.h"
#include "transport/socket.h"

namespace rdmaxfer {

namespace {

// The few OpenSSL 3.0 declarations used (ssl.h, prov_ssl.h, bio.h, err.h), vendored so the
// build needs no OpenSSL headers; the types stay opaque.
using SslCtx = void;
using Ssl = void;
using SslSession = void;
using Md = void;
constexpr long kCtrlMode = 33;                 // SSL_CTRL_MODE
constexpr long kCtrlSetReadAhead = 41;         // SSL_CTRL_SET_READ_AHEAD
constexpr long kCtrlSetMinProto = 123;         // SSL_CTRL_SET_MIN_PROTO_VERSION
constexpr long kCtrlSetMaxProto = 124;         // SSL_CTRL_SET_MAX_PROTO_VERSION
constexpr long kTls13 = 0x0304;                // TLS1_3_VERSION
constexpr long kModePartialWrite = 0x1;        // SSL_MODE_ENABLE_PARTIAL_WRITE
constexpr long kModeMovingBuffer = 0x2;        // SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER
constexpr uint64_t kOpEnableKtls = 1ull << 3;  // SSL_OP_ENABLE_KTLS
constexpr uint64_t kOpIgnoreEof = 1ull << 7;   // SSL_OP_IGNORE_UNEXPECTED_EOF
constexpr int kVerifyPeer = 0x1;               // SSL_VERIFY_PEER
constexpr int kVerifyFailIfNoCert = 0x2;       // SSL_VERIFY_FAIL_IF_NO_PEER_CERT
constexpr int kFiletypePem = 1;                // SSL_FILETYPE_PEM
constexpr int kErrorWantRead = 2;              // SSL_ERROR_WANT_READ
constexpr int kErrorWantWrite = 3;             // SSL_ERROR_WANT_WRITE
constexpr int kErrorSyscall = 5;               // SSL_ERROR_SYSCALL
constexpr int kErrorZeroReturn = 6;            // SSL_ERROR_ZERO_RETURN
constexpr int kBioCtrlGetKtlsSend = 73;        // BIO_CTRL_GET_KTLS_SEND
constexpr unsigned char kAes128GcmSha256[2] = {0x13, 0x01};
constexpr const char* kCipherSuites = "TLS_AES_128_GCM_SHA256";
constexpr unsigned char kPskIdentity[] = "rdmaxfer";
constexpr size_t kPskIdentityLen = sizeof(kPskIdentity) - 1;
constexpr size_t kRecordBytes = 16384;  // the largest TLS record's plaintext
// Ciphertext read from the socket at once (read-ahead): several records per recv(). Set once
// the peer is authenticated: until then a session holds OpenSSL's one-record buffer.
constexpr size_t kReadBufferBytes = 128 * 1024;
// The largest ClientHello a server takes (bytes). OpenSSL sizes its handshake buffer by the
// length the ClientHello's header claims (up to 128 KiB) before anyone is authenticated;
// rdmaxfer's own ClientHellos are a few hundred bytes.
constexpr size_t kMaxClientHello = 16384;
constexpr unsigned char kRecordHandshake = 22;  // TLS ContentType handshake
constexpr unsigned char kClientHello = 1;       // HandshakeType client_hello
constexpr double kWarmUpS = 10.0;               // the bound on TlsContext::warm_up()

using UseSessionCb = int (*)(Ssl*, const Md*, const unsigned char**, size_t*, SslSession**);
using FindSessionCb = int (*)(Ssl*, const unsigned char*, size_t, SslSession**);

// One table of libssl's (and, through it, libcrypto's) entry points.
#define RDMAXFER_SSL_CALLS(X)                                                             \
  X(TLS_method, const void*())                                                        \
  X(SSL_CTX_new, SslCtx*(const void*))                                                \
  X(SSL_CTX_free, void(SslCtx*))                                                      \
  X(SSL_CTX_ctrl, long(SslCtx*, int, long, void*))                                    \
  X(SSL_CTX_set_options, uint64_t(SslCtx*, uint64_t))                                 \
  X(SSL_CTX_set_num_tickets, int(SslCtx*, size_t))                                    \
  X(SSL_CTX_set_ciphersuites, int(SslCtx*, const char*))                              \
  X(SSL_CTX_set_psk_use_session_callback, void(SslCtx*, UseSessionCb))                \
  X(SSL_CTX_set_psk_find_session_callback, void(SslCtx*, FindSessionCb))              \
  X(SSL_CTX_set_ex_data, int(SslCtx*, int, void*))                                    \
  X(SSL_CTX_get_ex_data, void*(const SslCtx*, int))                                   \
  X(SSL_CTX_use_certificate_chain_file, int(SslCtx*, const char*))                    \
  X(SSL_CTX_use_PrivateKey_file, int(SslCtx*, const char*, int))                      \
  X(SSL_CTX_check_private_key, int(const SslCtx*))                                    \
  X(SSL_CTX_load_verify_locations, int(SslCtx*, const char*, const char*))            \
  X(SSL_CTX_set_verify, void(SslCtx*, int, void*))                                    \
  X(SSL_new, Ssl*(SslCtx*))                                                           \
  X(SSL_ctrl, long(Ssl*, int, long, void*))                                           \
  X(SSL_free, void(Ssl*))                                                             \
  X(SSL_set_fd, int(Ssl*, int))                                                       \
  X(SSL_set_connect_state, void(Ssl*))                                                \
  X(SSL_set_accept_state, void(Ssl*))                                                 \
  X(SSL_do_handshake, int(Ssl*))                                                      \
  X(SSL_read, int(Ssl*, void*, int))                                                  \
  X(SSL_write, int(Ssl*, const void*, int))                                           \
  X(SSL_get_error, int(const Ssl*, int))                                              \
  X(SSL_has_pending, int(const Ssl*))                                                 \
  X(SSL_set_default_read_buffer_len, void(Ssl*, size_t))                              \
  X(SSL_free_buffers, int(Ssl*))                                                      \
  X(SSL_get_SSL_CTX, SslCtx*(const Ssl*))                                             \
  X(SSL_get_wbio, void*(const Ssl*))                                                  \
  X(SSL_CIPHER_find, const void*(Ssl*, const unsigned char*))                         \
  X(SSL_SESSION_new, SslSession*())                                                   \
  X(SSL_SESSION_free, void(SslSession*))                                              \
  X(SSL_SESSION_set1_master_key, int(SslSession*, const unsigned char*, size_t))      \
  X(SSL_SESSION_set_cipher, int(SslSession*, const void*))                            \
  X(SSL_SESSION_set_protocol_version, int(SslSession*, int))                          \
  X(BIO_ctrl, long(void*, int, long, void*))                                          \
  X(ERR_get_error, unsigned long())                                                   \
  X(ERR_error_string_n, void(unsigned long, char*, size_t))                           \
  X(ERR_clear_error, void())                                                          \
  X(EVP_sha256, const void*())                                                        \
  X(HMAC, unsigned char*(const void*, const void*, int, const unsigned char*, size_t, \
                             unsigned char*, unsigned int*))

struct SslApi {
#define RDMAXFER_SSL_FIELD(name, ...) std::add_pointer_t<__VA_ARGS__> name = nullptr;
  RDMAXFER_SSL_CALLS(RDMAXFER_SSL_FIELD)
#undef RDMAXFER_SSL_FIELD
  std::string missing;
};

const SslApi& ssl() {
  static const SslApi api = [] {
    SslApi out;
    void* lib = nullptr;
    for (const char* name : {"libssl.so.3", "libssl.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
    }
    if (lib == nullptr) {
      out.missing = std::string("libssl.so.3 (OpenSSL 3) not found: ") + dlerror() +
                    "; install libssl3 (Debian) to use TLS";
      return out;
    }
#define RDMAXFER_SSL_LOOKUP(name, ...)                                    \
  out.name = reinterpret_cast<std::add_pointer_t<__VA_ARGS__>>(dlsym(lib, #name)); \
  if (out.name == nullptr && out.missing.empty()) {                       \
    out.missing = "libssl lacks " #name " (OpenSSL 3.0 or newer needed)"; \
  }
    RDMAXFER_SSL_CALLS(RDMAXFER_SSL_LOOKUP)
#undef RDMAXFER_SSL_LOOKUP
    return out;
  }();
  return api;
}

// OpenSSL's queued errors as one line ("" when none), the queue emptied.
std::string ssl_errors() {
  std::string text;
  while (const unsigned long e = ssl().ERR_get_error()) {
    char buf[256];
    ssl().ERR_error_string_n(e, buf, sizeof(buf));
    text += (text.empty() ? "" : "; ") + std::string(buf);
  }
  return text;
}

// A fresh session holding the PSK (OpenSSL takes ownership of what the callbacks return).
SslSession* psk_session(Ssl* s) {
  const SslApi& api = ssl();
  const auto* ctx = static_cast<const TlsContext*>(api.SSL_CTX_get_ex_data(api.SSL_get_SSL_CTX(s), 0));
  const void* cipher = api.SSL_CIPHER_find(s, kAes128GcmSha256);
  SslSession* session = api.SSL_SESSION_new();
  if (ctx == nullptr || cipher == nullptr || session == nullptr) {
    if (session != nullptr) api.SSL_SESSION_free(session);
    return nullptr;
  }
  if (api.SSL_SESSION_set1_master_key(session, ctx->psk(), 32) != 1 ||
      api.SSL_SESSION_set_cipher(session, cipher) != 1 ||
      api.SSL_SESSION_set_protocol_version(session, static_cast<int>(kTls13)) != 1) {
    api.SSL_SESSION_free(session);
    return nullptr;
  }
  return session;
}

int use_session(Ssl* s, const Md*, const unsigned char** id, size_t* id_len,
                SslSession** session) {
  *session = psk_session(s);
  if (*session == nullptr) return 0;
  *id = kPskIdentity;
  *id_len = kPskIdentityLen;
  return 1;
}

int find_session(Ssl* s, const unsigned char* id, size_t id_len, SslSession** session) {
  *session = nullptr;  // an unknown identity: no PSK, and without a certificate no handshake
  if (id_len == kPskIdentityLen && std::memcmp(id, kPskIdentity, id_len) == 0) {
    *session = psk_session(s);
    if (*session == nullptr) return 0;
  }
  return 1;
}

// Waits (bounded by `deadline`) for the first 9 bytes a client sends on `fd`, the headers of
// its first record and handshake message, without taking them off the socket, and refuses a
// ClientHello that claims more than kMaxClientHello bytes (see there). Anything else is left
// to OpenSSL to judge.
void check_client_hello(int fd, const Deadline& deadline, const std::string& where) {
  unsigned char head[9];
  auto refuse = [&](const std::string& why) {
    throw Error(ErrorKind::kConnection, "TLS handshake with " + where + " failed: " + why);
  };
  // poll() reports the socket readable once 9 bytes are there (or at end of stream).
  int lowat = static_cast<int>(sizeof(head));
  if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof(lowat)) != 0) {
    throw Error(ErrorKind::kTransport, errno_text("setsockopt(SO_RCVLOWAT)", errno));
  }
  ssize_t n = -1;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (deadline.expired() || poll(&p, 1, deadline.remaining_ms()) == 0) {
      throw Error(ErrorKind::kTimeout, "TLS handshake with " + where + ": no ClientHello within " +
                                           seconds_text(deadline.timeout_s()) + " s");
    }
    n = recv(fd, head, sizeof(head), MSG_PEEK);
    if (n >= 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) break;
  }
  lowat = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof(lowat)) != 0) {
    throw Error(ErrorKind::kTransport, errno_text("setsockopt(SO_RCVLOWAT)", errno));
  }
  if (n < 0) refuse(errno_text("recv", errno));
  if (n < static_cast<ssize_t>(sizeof(head))) refuse("the peer closed the connection");
  const size_t claimed = (size_t{head[6]} << 16) | (size_t{head[7]} << 8) | head[8];
  if (head[0] == kRecordHandshake && head[5] == kClientHello && claimed > kMaxClientHello) {
    refuse("its ClientHello claims " + std::to_string(claimed) + " bytes, more than the " +
           std::to_string(kMaxClientHello) + " a server takes (an rdmaxfer client sends a few "
           "hundred)");
  }
}

}  // namespace

std::string tls_unavailable_reason() { return ssl().missing; }

TlsContext::TlsContext(const TlsSettings& settings) {
  const SslApi& api = ssl();
  if (!api.missing.empty()) throw Error(ErrorKind::kUnsupported, "cannot use TLS: " + api.missing);
  const bool certs = !settings.cert.empty() || !settings.key.empty() || !settings.ca.empty();
  if (settings.secret.empty() && !certs) {
    throw Error(ErrorKind::kInvalidArgument,
                "tls needs a way to authenticate the peer: a shared secret (secret= / "
                "RDMAXFER_SECRET, used as the TLS 1.3 pre-shared key) or certificates "
                "(tls_cert=, tls_key=, tls_ca= / RDMAXFER_TLS_CERT, _KEY, _CA)");
  }
  if (!settings.secret.empty() && certs) {
    throw Error(ErrorKind::kInvalidArgument,
                "tls takes a shared secret (the pre-shared key) or certificates, not both: "
                "drop secret= / RDMAXFER_SECRET, or tls_cert/tls_key/tls_ca");
  }
  if (certs && (settings.cert.empty() || settings.key.empty() || settings.ca.empty())) {
    throw Error(ErrorKind::kInvalidArgument,
                "tls with certificates needs all three of tls_cert= (this side's PEM chain), "
                "tls_key= (its private key) and tls_ca= (the CAs a peer's certificate must "
                "chain to)");
  }
  if (!settings.secret.empty()) {
    static const unsigned char kLabel[] = "rdmaxfer-tls-psk-v1";
    unsigned int len = 0;
    if (api.HMAC(api.EVP_sha256(), settings.secret.data(), static_cast<int>(settings.secret.size()),
                 kLabel, sizeof(kLabel) - 1, psk_, &len) == nullptr ||
        len != sizeof(psk_)) {
      throw Error(ErrorKind::kTransport, "deriving the TLS pre-shared key failed: " + ssl_errors());
    }
    description_ = "TLS 1.3 (AES-128-GCM), pre-shared key from the shared secret";
  } else {
    description_ = "TLS 1.3 (AES-128-GCM), certificates (CA file " + settings.ca + ")";
  }
  for (void** slot : {&client_, &server_}) {
    const bool server = slot == &server_;
    SslCtx* ctx = api.SSL_CTX_new(api.TLS_method());
    if (ctx == nullptr) throw Error(ErrorKind::kTransport, "SSL_CTX_new failed: " + ssl_errors());
    *slot = ctx;
    auto fail = [&](const std::string& what) {
      throw Error(ErrorKind::kInvalidArgument, what + ": " + ssl_errors());
    };
    if (api.SSL_CTX_ctrl(ctx, kCtrlSetMinProto, kTls13, nullptr) != 1 ||
        api.SSL_CTX_ctrl(ctx, kCtrlSetMaxProto, kTls13, nullptr) != 1 ||
        api.SSL_CTX_set_ciphersuites(ctx, kCipherSuites) != 1 ||
        api.SSL_CTX_set_num_tickets(ctx, 0) != 1 || api.SSL_CTX_set_ex_data(ctx, 0, this) != 1) {
      fail("setting up TLS 1.3 failed");
    }
    api.SSL_CTX_set_options(ctx, kOpEnableKtls | kOpIgnoreEof);
    api.SSL_CTX_ctrl(ctx, kCtrlMode, kModePartialWrite | kModeMovingBuffer, nullptr);
    if (!settings.secret.empty()) {
      if (server) {
        api.SSL_CTX_set_psk_find_session_callback(ctx, find_session);
      } else {
        api.SSL_CTX_set_psk_use_session_callback(ctx, use_session);
        // No CA is loaded: a server that answers with a certificate instead of the PSK fails.
        api.SSL_CTX_set_verify(ctx, kVerifyPeer, nullptr);
      }
      continue;
    }
    if (api.SSL_CTX_use_certificate_chain_file(ctx, settings.cert.c_str()) != 1) {
      fail("tls_cert=" + settings.cert + " does not load as a PEM certificate chain");
    }
    if (api.SSL_CTX_use_PrivateKey_file(ctx, settings.key.c_str(), kFiletypePem) != 1 ||
        api.SSL_CTX_check_private_key(ctx) != 1) {
      fail("tls_key=" + settings.key + " does not load as the PEM private key of tls_cert=" +
           settings.cert);
    }
    if (api.SSL_CTX_load_verify_locations(ctx, settings.ca.c_str(), nullptr) != 1) {
      fail("tls_ca=" + settings.ca + " does not load as a PEM CA file");
    }
    api.SSL_CTX_set_verify(ctx, kVerifyPeer | kVerifyFailIfNoCert, nullptr);
  }
  warm_up();
}

void TlsContext::warm_up() const {
  // What a process does the first time it runs a handshake costs milliseconds natively but
  // took 1.5-1.7 s in the emulated test VM (OpenSSL setting up its algorithms, and the kernel
  // loading its TLS module when OpenSSL asks a TCP socket for kernel TLS), where a peer's
  // first connect then met the acceptor's 2 s pre-auth deadline. One handshake between this
  // context's two ends over loopback TCP pays that here instead. Best effort: a failure (no
  // loopback, a certificate our own CA file does not cover) leaves it to the first real one.
  const Deadline deadline(kWarmUpS);
  UniqueFd client;
  UniqueFd server;
  try {
    UniqueFd listener = listen_tcp("127.0.0.1", 0, 1);
    client = connect_tcp("127.0.0.1", local_port(listener.get()), deadline, false);
    pollfd p{listener.get(), POLLIN, 0};
    if (poll(&p, 1, deadline.remaining_ms()) != 1) return;
    server = UniqueFd(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!server.valid()) return;
    set_nonblocking(client.get(), true);
  } catch (const Error& e) {
    log::write(log::Level::kDebug, std::string("TLS warm-up: no loopback pair: ") + e.what());
    return;
  }
  std::thread accepting([&] {
    try {
      handshake(server.get(), true, deadline, "the warm-up", "");
    } catch (const Error& e) {
      ::shutdown(server.get(), SHUT_RDWR);  // the client's side fails at once too
      log::write(log::Level::kDebug, std::string("TLS warm-up, server side: ") + e.what());
    }
  });
  try {
    handshake(client.get(), false, deadline, "the warm-up", "");
  } catch (const Error& e) {
    ::shutdown(client.get(), SHUT_RDWR);
    log::write(log::Level::kDebug, std::string("TLS warm-up, client side: ") + e.what());
  }
  accepting.join();
}

TlsContext::~TlsContext() {
  if (client_ != nullptr) ssl().SSL_CTX_free(client_);
  if (server_ != nullptr) ssl().SSL_CTX_free(server_);
}

std::unique_ptr<TlsSession> TlsContext::handshake(int fd, bool server, const Deadline& deadline,
                                                  const std::string& where,
                                                  const std::string& clear) const {
  const SslApi& api = ssl();
  Ssl* s = api.SSL_new(server ? server_ : client_);
  if (s == nullptr) throw Error(ErrorKind::kTransport, "SSL_new failed: " + ssl_errors());
  auto session = std::make_unique<TlsSession>(s);
  if (api.SSL_set_fd(s, fd) != 1) throw Error(ErrorKind::kTransport, "SSL_set_fd failed");
  if (server) {
    check_client_hello(fd, deadline, where);
    api.SSL_set_accept_state(s);
  } else {
    api.SSL_set_connect_state(s);
  }
  auto fail = [&](const std::string& why) {
    throw Error(ErrorKind::kConnection,
                "TLS handshake with " + where + " failed: " + why +
                    " (both sides need tls on with the same secret, or certificates from a "
                    "CA the other side's tls_ca trusts)");
  };
  // Runs `step` (an SSL call) until it returns > 0, waiting on the socket as OpenSSL asks.
  auto run = [&](auto step) {
    for (;;) {
      api.ERR_clear_error();
      errno = 0;
      const int rc = step();
      if (rc > 0) return rc;
      const int err = api.SSL_get_error(s, rc);
      const int saved = errno;
      if (err != kErrorWantRead && err != kErrorWantWrite) {
        std::string why = ssl_errors();
        if (why.empty()) {
          why = saved != 0 ? errno_text("socket", saved) : "the peer closed the connection";
        }
        fail(why);
      }
      pollfd p{fd, static_cast<short>(err == kErrorWantRead ? POLLIN : POLLOUT), 0};
      if (deadline.expired() || poll(&p, 1, deadline.remaining_ms()) == 0) {
        throw Error(ErrorKind::kTimeout, "TLS handshake with " + where + ": no answer within " +
                                             seconds_text(deadline.timeout_s()) + " s");
      }
    }
  };
  auto write_all = [&](const unsigned char* data, size_t len) {
    for (size_t done = 0; done < len;) {
      done += static_cast<size_t>(
          run([&] { return api.SSL_write(s, data + done, static_cast<int>(len - done)); }));
    }
  };
  auto read_exact = [&](unsigned char* data, size_t len) {
    for (size_t done = 0; done < len;) {
      done += static_cast<size_t>(
          run([&] { return api.SSL_read(s, data + done, static_cast<int>(len - done)); }));
    }
  };
  run([&] { return api.SSL_do_handshake(s); });
  // Then, inside TLS, the server sends the Hello and HelloAck as it saw them, with its
  // verdict (TLS 1.3 ends the client's half before the server has checked the client's
  // certificate, so a refused client learns it here), and the client answers whether they
  // match what it sent and received: a relay that altered those clear bytes (the engine id,
  // the connection id) fails the connection on both sides. Read-ahead only after this, so
  // nothing the peer sends later waits unseen in the session meanwhile.
  constexpr unsigned char kAccepted = 1;
  constexpr unsigned char kAltered = 2;
  std::string seen(clear.size() + 1, '\0');
  auto* bytes = reinterpret_cast<unsigned char*>(seen.data());
  unsigned char answer = kAccepted;
  if (server) {
    std::memcpy(bytes, clear.data(), clear.size());
    bytes[clear.size()] = kAccepted;
    write_all(bytes, seen.size());
    read_exact(&answer, 1);
  } else {
    read_exact(bytes, seen.size());
    if (bytes[clear.size()] != kAccepted) fail("the server refused the connection");
    if (seen.compare(0, clear.size(), clear) != 0) answer = kAltered;
    write_all(&answer, 1);
  }
  if (answer != kAccepted) {
    throw Error(ErrorKind::kConnection,
                "TLS handshake with " + where +
                    " failed: the Hello or its reply (sent in clear before TLS) differs between "
                    "the two sides: something on the path between them altered it");
  }
  // Authenticated: the large read buffer from here on (taken at the next read, once the
  // handshake's buffers, now empty, are freed; kept as they are if not empty).
  api.SSL_set_default_read_buffer_len(s, kReadBufferBytes);
  api.SSL_free_buffers(s);
  api.SSL_ctrl(s, kCtrlSetReadAhead, 1, nullptr);
  return session;
}

TlsSession::~TlsSession() { ssl().SSL_free(ssl_); }

ssize_t TlsSession::read(void* buf, size_t len) {
  const SslApi& api = ssl();
  std::lock_guard<std::mutex> lock(mu_);
  api.ERR_clear_error();
  errno = 0;
  const int n = api.SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(len, INT_MAX)));
  if (n > 0) return n;
  const int err = api.SSL_get_error(ssl_, n);
  const int saved = errno;
  if (err == kErrorWantRead || err == kErrorWantWrite) {
    errno = EAGAIN;
    return -1;
  }
  if (err == kErrorZeroReturn) return 0;
  std::string why = ssl_errors();
  if (err == kErrorSyscall && why.empty()) {
    if (saved == 0) return 0;
    errno = saved;
    return -1;
  }
  throw Error(ErrorKind::kConnection,
              "TLS record rejected (" + why +
                  "): the bytes were altered, injected or cut between the peers");
}

ssize_t TlsSession::writev(const iovec* iov, int n_iov) {
  const SslApi& api = ssl();
  std::lock_guard<std::mutex> lock(mu_);
  // A large first piece goes as it is (records of 16 KiB); small pieces are copied into one
  // record, so a header and its metadata do not each cost a record and a syscall. A retry after
  // EAGAIN presents the same bytes from the same start (the send queue only grows at its end).
  const void* data = iov[0].iov_base;
  size_t len = iov[0].iov_len;
  if (len < kRecordBytes && n_iov > 1) {
    len = 0;
    for (int i = 0; i < n_iov && len < kRecordBytes; ++i) {
      const size_t take = std::min(iov[i].iov_len, kRecordBytes - len);
      std::memcpy(coalesce_ + len, iov[i].iov_base, take);
      len += take;
    }
    data = coalesce_;
  }
  api.ERR_clear_error();
  errno = 0;
  const int n = api.SSL_write(ssl_, data, static_cast<int>(std::min<size_t>(len, INT_MAX)));
  if (n > 0) return n;
  const int err = api.SSL_get_error(ssl_, n);
  const int saved = errno;
  if (err == kErrorWantRead || err == kErrorWantWrite) {
    errno = EAGAIN;
    return -1;
  }
  const std::string why = ssl_errors();
  if (err == kErrorSyscall && why.empty()) {
    errno = saved != 0 ? saved : EPIPE;
    return -1;
  }
  throw Error(ErrorKind::kConnection, "TLS write failed: " + why);
}

bool TlsSession::pending() {
  std::lock_guard<std::mutex> lock(mu_);
  return ssl().SSL_has_pending(ssl_) == 1;
}

bool TlsSession::ktls_active() {
  std::lock_guard<std::mutex> lock(mu_);
  return ssl().BIO_ctrl(ssl().SSL_get_wbio(ssl_), kBioCtrlGetKtlsSend, 0, nullptr) > 0;
}

}  // namespace rdmaxfer
