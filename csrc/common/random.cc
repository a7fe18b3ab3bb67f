#include "common/random.h"

#include <sys/random.h>

#include <cerrno>

#include "common/error.h"

namespace rdmaxfer {

void random_bytes(void* data, size_t size) {
  auto* out = static_cast<uint8_t*>(data);
  size_t got = 0;
  while (got < size) {
    const ssize_t r = getrandom(out + got, size - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno("getrandom");
    }
    got += static_cast<size_t>(r);
  }
}

uint32_t random_u32() {
  uint32_t v = 0;
  random_bytes(&v, sizeof(v));
  return v;
}

uint64_t random_u64() {
  uint64_t v = 0;
  random_bytes(&v, sizeof(v));
  return v;
}

}  // namespace rdmaxfer
