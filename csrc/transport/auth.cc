#include "transport/auth.h"

#include <dlfcn.h>

#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/random.h"

namespace rdmaxfer {

namespace {

// The two libcrypto entry points we use (OpenSSL 3 keeps HMAC() and EVP_sha256()).
using EvpSha256Fn = const void* (*)();
using HmacFn = unsigned char* (*)(const void* md, const void* key, int key_len,
                                  const unsigned char* data, size_t data_len, unsigned char* out,
                                  unsigned int* out_len);

struct Crypto {
  EvpSha256Fn evp_sha256 = nullptr;
  HmacFn hmac = nullptr;
  std::string missing;
};

const Crypto& crypto() {
  static const Crypto c = [] {
    Crypto out;
    void* lib = nullptr;
    for (const char* name : {"libcrypto.so.3", "libcrypto.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
    }
    if (lib == nullptr) {
      out.missing = std::string("libcrypto.so.3 (OpenSSL) not found: ") + dlerror() +
                    "; install libssl3 (Debian) to use a shared secret";
      return out;
    }
    out.evp_sha256 = reinterpret_cast<EvpSha256Fn>(dlsym(lib, "EVP_sha256"));
    out.hmac = reinterpret_cast<HmacFn>(dlsym(lib, "HMAC"));
    if (out.evp_sha256 == nullptr || out.hmac == nullptr) {
      out.missing = "libcrypto lacks EVP_sha256/HMAC";
    }
    return out;
  }();
  return c;
}

Digest hmac_sha256(const std::string& secret, const std::vector<uint8_t>& data) {
  const Crypto& c = crypto();
  if (!c.missing.empty()) throw Error(ErrorKind::kUnsupported, c.missing);
  Digest out{};
  unsigned int len = 0;
  if (c.hmac(c.evp_sha256(), secret.data(), static_cast<int>(secret.size()), data.data(),
             data.size(), out.data(), &len) == nullptr ||
      len != out.size()) {
    throw Error(ErrorKind::kTransport, "HMAC-SHA256 failed in libcrypto");
  }
  return out;
}

void append(std::vector<uint8_t>* out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out->insert(out->end(), b, b + n);
}

}  // namespace

std::string auth_unavailable_reason() { return crypto().missing; }

Nonce make_nonce() {
  Nonce n{};
  random_bytes(n.data(), n.size());
  return n;
}

Digest client_proof(const std::string& secret, const Nonce& server_nonce, const uint8_t* hello,
                    size_t hello_size) {
  static const char kLabel[] = "rdmaxfer-auth-v1 client";
  std::vector<uint8_t> data;
  append(&data, kLabel, sizeof(kLabel) - 1);
  append(&data, server_nonce.data(), server_nonce.size());
  append(&data, hello, hello_size);
  return hmac_sha256(secret, data);
}

Digest server_proof(const std::string& secret, const Nonce& client_nonce,
                    const Nonce& server_nonce) {
  static const char kLabel[] = "rdmaxfer-auth-v1 server";
  std::vector<uint8_t> data;
  append(&data, kLabel, sizeof(kLabel) - 1);
  append(&data, client_nonce.data(), client_nonce.size());
  append(&data, server_nonce.data(), server_nonce.size());
  return hmac_sha256(secret, data);
}

bool digests_equal(const Digest& a, const Digest& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace rdmaxfer
