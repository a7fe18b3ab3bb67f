// Little-endian load/store for wire records (the wire format is little-endian on every host),
// and byte counts in messages.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace rdmaxfer {

template <typename T>
inline void store_le(uint8_t* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

template <typename T>
inline T load_le(const uint8_t* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(in[i]) << (8 * i);
  return value;
}

// A byte count for a message: "4096 bytes".
inline std::string bytes_text(uint64_t n) { return std::to_string(n) + " bytes"; }

}  // namespace rdmaxfer
