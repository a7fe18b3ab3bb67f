// Gathered WRITEs and READs: a channel that can carry several small WRITEs (or READs) as one
// unit (TCP: one frame holding every piece, one acknowledgement naming the pieces the target
// refused; shm: one record, copied with one process_vm_readv/writev per IOV_MAX pieces; verbs:
// chained WRs), so a batch of small operations (protocol/batch.h) pays the per-operation costs
// (frame, acknowledgement, request, system call, wake-ups) once per group rather than once per
// piece. A channel offers it by also deriving from GatherWrites (GatherReads); the batch posts
// one piece at a time on channels that do not, and for local regions whose limits are zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/error.h"
#include "core/descriptor.h"
#include "core/region.h"
#include "core/request.h"

namespace rdmaxfer {

// One WRITE (READ) of a group: `length` bytes from (into) local[local_offset:] to (from) the
// peer's region `remote` at remote_offset.
struct GatherPiece {
  uint64_t local_offset = 0;
  Descriptor remote;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// Called once for each piece the target refused (its index in the group, why), before the
// group's request completes.
using PieceFailed = std::function<void(size_t index, const Error& why)>;

// What one group may hold: pieces, bytes of one piece, bytes in all (max_pieces 0: this
// channel does not gather for that local region).
struct GatherLimits {
  size_t max_pieces = 0;
  uint64_t max_piece_bytes = 0;
  uint64_t max_bytes = 0;
};

class GatherWrites {
 public:
  using Limits = GatherLimits;

  virtual ~GatherWrites() = default;
  virtual Limits gather_limits(const MemoryRegion& local) const = 0;
  // WRITEs every piece (all from `local`, each inside it and inside its descriptor: the caller
  // checked) within the limits. The request is done once the target placed every piece it
  // accepted and reported the others through `failed`; it fails (every piece with it) when
  // the channel closes first. Throws Error(kClosed) when the channel is closed.
  virtual RequestPtr post_write_gather(const std::shared_ptr<MemoryRegion>& local,
                                       const std::vector<GatherPiece>& pieces,
                                       PieceFailed failed) = 0;
};

class GatherReads {
 public:
  virtual ~GatherReads() = default;
  virtual GatherLimits read_gather_limits(const MemoryRegion& local) const = 0;
  // READs every piece into `local` (each inside it, writable, and inside its descriptor: the
  // caller checked) within the limits; done and failed as post_write_gather.
  virtual RequestPtr post_read_gather(const std::shared_ptr<MemoryRegion>& local,
                                      const std::vector<GatherPiece>& pieces,
                                      PieceFailed failed) = 0;
};

}  // namespace rdmaxfer
