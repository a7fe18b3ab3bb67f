// How a transfer is cut into chunks and spread over streams (TCP) or QPs (verbs).
//
// Like download managers (aria2's --split/--min-split-size), small transfers use one stream and
// one chunk; large ones use every stream with several chunks each so the streams stay busy:
//   streams = 1 below 4 MiB, else min(available, ceil(length / 4 MiB))
//   chunk   = clamp(length / (streams * 4), 256 KiB, 16 MiB), rounded up to 4 KiB
// Either can be forced through TransferOptions.
#pragma once

#include <algorithm>
#include <cstdint>

#include "transport/transport.h"

namespace rdmaxfer {

struct ChunkPlan {
  uint64_t chunk = 0;  // bytes per chunk (the last one may be shorter)
  int streams = 1;     // how many streams/QPs to use
  uint64_t count = 1;  // number of chunks (1 for an empty transfer)
};

inline ChunkPlan plan_chunks(uint64_t length, int available, const TransferOptions& options,
                             uint64_t max_chunk = 0) {
  constexpr uint64_t kKiB = 1024;
  constexpr uint64_t kMiB = 1024 * kKiB;
  ChunkPlan plan;
  available = std::max(available, 1);
  if (options.streams > 0) {
    plan.streams = std::min(options.streams, available);
  } else if (length >= 4 * kMiB) {
    plan.streams = static_cast<int>(
        std::min<uint64_t>(static_cast<uint64_t>(available), (length + 4 * kMiB - 1) / (4 * kMiB)));
  }
  if (options.chunk_size > 0) {
    plan.chunk = options.chunk_size;
  } else {
    uint64_t c = length / (static_cast<uint64_t>(plan.streams) * 4);
    c = std::clamp<uint64_t>(c, 256 * kKiB, 16 * kMiB);
    plan.chunk = (c + 4 * kKiB - 1) / (4 * kKiB) * (4 * kKiB);
  }
  if (max_chunk > 0) plan.chunk = std::min(plan.chunk, max_chunk);
  plan.count = length == 0 ? 1 : (length + plan.chunk - 1) / plan.chunk;
  return plan;
}

}  // namespace rdmaxfer
