// Little-endian wire records written and read field by field: a header's layout is the order of
// its put/get calls, with the offsets kept by the cursor instead of written out by hand. Every
// wire header (descriptors, bootstrap hellos, frames, verbs control messages and endpoint
// records) goes through these; common/bytes.h holds the single loads and stores beneath.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/bytes.h"

namespace rdmaxfer {

// Writes a record of `size` bytes at `out`, zero-filled first (reserved bytes stay 0).
class LeWriter {
 public:
  LeWriter(uint8_t* out, size_t size) : out_(out), size_(size) { std::memset(out, 0, size); }
  template <typename T>
  LeWriter& put(T value) {
    assert(at_ + sizeof(T) <= size_);
    store_le<T>(out_ + at_, value);
    at_ += sizeof(T);
    return *this;
  }
  LeWriter& bytes(const void* data, size_t n) {
    assert(at_ + n <= size_);
    std::memcpy(out_ + at_, data, n);
    at_ += n;
    return *this;
  }
  // Leaves `n` reserved (zero) bytes.
  LeWriter& skip(size_t n) {
    assert(at_ + n <= size_);
    at_ += n;
    return *this;
  }
  size_t offset() const { return at_; }

 private:
  uint8_t* const out_;
  const size_t size_;
  size_t at_ = 0;
};

// Reads a record whose `size` bytes the caller has checked are there.
class LeReader {
 public:
  LeReader(const uint8_t* in, size_t size) : in_(in), size_(size) {}
  template <typename T>
  T get() {
    assert(at_ + sizeof(T) <= size_);
    const T value = load_le<T>(in_ + at_);
    at_ += sizeof(T);
    return value;
  }
  // True when the next `n` bytes equal `data` (a magic); consumes them either way.
  bool matches(const void* data, size_t n) {
    assert(at_ + n <= size_);
    const bool same = std::memcmp(in_ + at_, data, n) == 0;
    at_ += n;
    return same;
  }
  LeReader& skip(size_t n) {
    assert(at_ + n <= size_);
    at_ += n;
    return *this;
  }
  // Copies the next `n` bytes to `out`.
  LeReader& copy(void* out, size_t n) {
    assert(at_ + n <= size_);
    std::memcpy(out, in_ + at_, n);
    at_ += n;
    return *this;
  }
  // True when the next `n` (reserved) bytes are all zero; consumes them.
  bool zeros(size_t n) {
    assert(at_ + n <= size_);
    bool zero = true;
    for (size_t i = 0; i < n; ++i) zero = zero && in_[at_ + i] == 0;
    at_ += n;
    return zero;
  }
  size_t offset() const { return at_; }

 private:
  const uint8_t* const in_;
  const size_t size_;
  size_t at_ = 0;
};

}  // namespace rdmaxfer
