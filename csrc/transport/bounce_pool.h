// The bounce pool of one memory domain: fixed-size host slabs, registered once with the
// transport, that the staging pipeline (protocol/staging.h) copies device memory through.
//
// Slabs are made on demand up to a bound on the pool's total bytes and then reused by every
// later operation: no allocation and no registration per operation. A slab is page-locked by
// cuMemHostAlloc (portable to every context) when the CUDA driver loads, so cuMemcpy*Async
// really runs on the copy engines; else it is page-aligned host memory (the host stand-in
// copier of the tests). An operation takes all the slabs it needs at once, so two operations
// never each hold part of what the other waits for; when the pool is exhausted it waits, bounded
// by the operation's deadline, for slabs to come back.
//
// Configuration (read when the pool is made, i.e. on the engine's first staged transfer):
//   RDMAXFER_BOUNCE_SLAB_BYTES  bytes per slab = the largest staging chunk (default 8 MiB)
//   RDMAXFER_BOUNCE_POOL_BYTES  total bytes of slabs (default 256 MiB; at least one slab)
//
// Lifecycle: made by MemoryDomain::bounce_pool() -> acquire/release -> close(): free slabs
// are deregistered and freed, later releases free theirs at once, acquire throws kClosed. A slab
// given back `in_use` (a wire operation that could not be stopped may still write into it) is
// stranded: never deregistered nor freed, so no late write lands in freed memory.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "common/deadline.h"

namespace rdmaxfer {

class MemoryDomain;
class MemoryRegion;

struct BouncePoolConfig {
  uint64_t slab_bytes = kDefaultSlabBytes;
  uint64_t max_bytes = kDefaultPoolBytes;

  static constexpr uint64_t kDefaultSlabBytes = 8ull << 20;
  static constexpr uint64_t kDefaultPoolBytes = 256ull << 20;
  static constexpr const char* kSlabEnv = "RDMAXFER_BOUNCE_SLAB_BYTES";
  static constexpr const char* kPoolEnv = "RDMAXFER_BOUNCE_POOL_BYTES";
  // The defaults overridden by the variables above; Error(kInvalidArgument) naming a bad one.
  static BouncePoolConfig from_env();
};

// What the pool did so far (for tests, `Engine.stats()` and tuning).
struct BouncePoolStats {
  uint64_t slab_bytes = 0;
  uint64_t max_slabs = 0;    // the bound: max_bytes / slab_bytes, at least 1
  uint64_t slabs = 0;        // made so far (free + in use), never more than max_slabs
  uint64_t free = 0;
  uint64_t allocations = 0;  // slabs ever made (each one registered once)
  uint64_t acquires = 0;     // operations served
  uint64_t waits = 0;        // operations that had to wait for slabs
  uint64_t timeouts = 0;     // waits that ran out of time
  uint64_t stranded = 0;
  uint64_t peak_slabs = 0;   // the most slabs that existed at once (never more than max_slabs)
};

class BounceSlab {
 public:
  virtual ~BounceSlab() = default;
  virtual uint8_t* data() const = 0;
  uint64_t length() const { return length_; }
  const std::shared_ptr<MemoryRegion>& region() const { return region_; }

 protected:
  explicit BounceSlab(uint64_t length) : length_(length) {}

 private:
  friend class BouncePool;
  uint64_t length_;
  std::shared_ptr<MemoryRegion> region_;
};

class BouncePool {
 public:
  BouncePool(MemoryDomain& domain, const BouncePoolConfig& config);
  ~BouncePool();
  BouncePool(const BouncePool&) = delete;
  BouncePool& operator=(const BouncePool&) = delete;

  uint64_t slab_bytes() const { return slab_bytes_; }
  uint64_t max_slabs() const { return max_slabs_; }

  // Takes `count` slabs (1..max_slabs) at once, waiting until `deadline` for them; `stop` is
  // asked every slice and throws to end the wait (the engine closing, the endpoint failing).
  // Throws Error(kTimeout) naming the pool's size and how to raise it, Error(kClosed) after
  // close(), Error(kRegistration) when a new slab cannot be allocated or registered.
  std::vector<std::unique_ptr<BounceSlab>> acquire(int count, const Deadline& deadline,
                                                   const std::function<void()>& stop);
  // Gives a slab back (`in_use`: see the header comment).
  void release(std::unique_ptr<BounceSlab> slab, bool in_use);
  void close(double timeout_s);
  BouncePoolStats stats() const;

 private:
  std::unique_ptr<BounceSlab> make_slab();
  void free_slab(std::unique_ptr<BounceSlab> slab, double timeout_s);

  MemoryDomain& domain_;
  const uint64_t slab_bytes_;
  const uint64_t max_slabs_;
  mutable std::mutex mu_;
  std::condition_variable returned_;
  std::vector<std::unique_ptr<BounceSlab>> free_;
  std::vector<std::unique_ptr<BounceSlab>> stranded_;
  uint64_t slabs_ = 0;    // made and not freed (free_ + in use), reserved ones included
  bool closed_ = false;
  BouncePoolStats counts_;
};

}  // namespace rdmaxfer
