// Unpredictable numbers from the kernel's CSPRNG (getrandom(2)): remote keys, connection and
// engine ids, nonces. A peer that saw earlier values cannot guess the next ones.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmaxfer {

// Fills data[0, size) from getrandom(2); throws Error(kTransport) with errno text on failure.
void random_bytes(void* data, size_t size);
uint32_t random_u32();
uint64_t random_u64();

}  // namespace rdmaxfer
