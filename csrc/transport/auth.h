// Mutual challenge-response authentication on the bootstrap, with a shared secret.
//
// HMAC-SHA256 comes from OpenSSL's libcrypto, loaded at run time (libcrypto.so.3), so the
// package builds and runs without OpenSSL headers; only engines configured with a secret need
// it. Nonces come from getrandom(2); proofs are compared in constant time.
//
// Exchange on each bootstrap stream (after the Hello, before anything else — so a peer without
// the secret learns no QPN, address or key):
//   server -> client  HelloAck{status=kAuthChallenge} + nonce_s (32 bytes)
//   client -> server  proof_c = HMAC(secret, "rdmaxfer-auth-v1 client" | nonce_s | hello) (32)
//                     + nonce_c (32)
//   server -> client  HelloAck{status=kOk} + proof_s = HMAC(secret, "rdmaxfer-auth-v1 server"
//                     | nonce_c | nonce_s) (32), or HelloAck{status=kAuthFailed} and close.
// A client with a secret refuses a server that does not challenge it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace rdmaxfer {

using Digest = std::array<uint8_t, 32>;
using Nonce = std::array<uint8_t, 32>;

// "" when HMAC-SHA256 is usable, else why not (libcrypto missing).
std::string auth_unavailable_reason();

Nonce make_nonce();
Digest client_proof(const std::string& secret, const Nonce& server_nonce, const uint8_t* hello,
                    size_t hello_size);
Digest server_proof(const std::string& secret, const Nonce& client_nonce,
                    const Nonce& server_nonce);
bool digests_equal(const Digest& a, const Digest& b);  // constant time

}  // namespace rdmaxfer
