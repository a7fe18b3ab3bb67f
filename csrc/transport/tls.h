// TLS 1.3 on a bootstrap stream, from OpenSSL's libssl loaded at run time (libssl.so.3, one
// table of entry points in tls.cc; no OpenSSL headers needed to build), so a machine without
// libssl imports and runs plain TCP and only an engine with TLS on needs it.
//
// Authentication, mutual either way:
//  - a shared secret: a TLS 1.3 external PSK (identity "rdmaxfer", key HMAC-SHA256(secret,
//    "rdmaxfer-tls-psk-v1"), cipher TLS_AES_128_GCM_SHA256, PSK with (EC)DHE key exchange,
//    RFC 8446 4.2.9/4.2.11), so only a peer holding the same secret completes the handshake;
//  - certificates: cert/key (PEM) presented by each side, and the peer's chain verified against
//    the CA file `ca` (SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT on both sides).
// The handshake runs on each stream right after the Hello (bootstrap.h), and the two sides then
// compare the clear Hello and HelloAck inside TLS (handshake()); every record is then
// AES-GCM encrypted and authenticated, so an altered, injected or replayed byte fails the
// stream's next read (TlsSession::read) and with it the connection. Kernel TLS offload is asked
// for (SSL_OP_ENABLE_KTLS) and used where the kernel has it (ktls_active()).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "common/deadline.h"

namespace rdmaxfer {

struct TlsSettings {
  std::string secret;  // the PSK's source, "" = none
  std::string cert;    // PEM certificate chain file, "" = none
  std::string key;     // PEM private key file of `cert`
  std::string ca;      // PEM file of the CAs a peer's certificate must chain to
};

// "" when libssl is usable, else why not.
std::string tls_unavailable_reason();

class TlsSession;

// Both ends' SSL_CTX of one engine. Throws Error(kUnsupported) without libssl, and
// Error(kInvalidArgument) for settings that cannot work (no secret and no certificate, both,
// a file that does not load), naming the setting.
class TlsContext {
 public:
  explicit TlsContext(const TlsSettings& settings);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // "TLS 1.3, PSK from the shared secret" / "TLS 1.3, certificates (CA file ...)".
  const std::string& describe() const { return description_; }
  // The TLS handshake on the connected (non-blocking) socket `fd`, as the server or the
  // client, bounded by `deadline`; `clear`: the bytes this side sent and received in clear
  // before it (the Hello, then the HelloAck), which the two sides then compare inside TLS.
  // Throws Error(kConnection) naming `where` and OpenSSL's reason, or saying that `clear`
  // differs between the sides; Error(kTimeout) when the deadline passes.
  std::unique_ptr<TlsSession> handshake(int fd, bool server, const Deadline& deadline,
                                        const std::string& where, const std::string& clear) const;

  // The PSK derived from the secret (32 bytes; read by the PSK callbacks).
  const unsigned char* psk() const { return psk_; }

 private:
  // One handshake of this context with itself over a socket pair (see tls.cc), run by the
  // constructor; errors are dropped.
  void warm_up() const;

  unsigned char psk_[32] = {};
  std::string description_;
  void* client_ = nullptr;  // SSL_CTX*
  void* server_ = nullptr;
};

// One established TLS session on a non-blocking socket. Calls on one session are serialized
// by its own lock (OpenSSL allows no concurrent use of one SSL object); none blocks.
class TlsSession {
 public:
  explicit TlsSession(void* ssl) : ssl_(ssl) {}
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // Like recv(2) with MSG_DONTWAIT: bytes read (one record at most), 0 at the end of the
  // stream, -1 with errno EAGAIN when nothing is ready; throws Error(kConnection) for a record
  // that fails authentication or any other TLS error, with OpenSSL's reason.
  ssize_t read(void* buf, size_t len);
  // Like send(2) with MSG_DONTWAIT for the bytes of `iov` in order (small pieces copied into
  // one record): bytes taken, or -1 with errno EAGAIN (call again with the same bytes first),
  // or -1 with errno set for a broken socket; throws Error(kConnection) for a TLS error.
  ssize_t writev(const iovec* iov, int n_iov);
  // Bytes held inside the session, decrypted or read ahead (not visible to poll()).
  bool pending();
  bool ktls_active();

 private:
  std::mutex mu_;
  void* ssl_;
  unsigned char coalesce_[16384];
};

}  // namespace rdmaxfer
