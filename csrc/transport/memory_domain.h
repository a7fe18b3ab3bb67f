// The memory domain of one transport (one device): every registration goes through it.
//
// A MemoryDomain owns the RegionTable (the keys peers may name), the access-flag policy (which
// Access bits a registration gets: remote write implies local write, the engine's own pinned
// memory is always locally writable) and the register/alloc_pinned/register_device/deregister
// lifecycle. The transport only builds its region objects (a verbs MR, plain bookkeeping on
// TCP and loopback) through the small RegistrationBackend interface.
//
// Matched lifecycle pairs: register_memory/alloc_pinned/register_device_memory -> deregister;
// bounce_pool() (made on first use) -> close_bounce_pool() (the engine, before its transport
// shuts down).
// Temporary registrations of unregistered user memory are cached above this class, where the
// owner of the memory is known (python/rdmaxfer/transport/domain.py, "registration cache").
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "core/region.h"

namespace rdmaxfer {

// What a transport supplies to its MemoryDomain: its region objects.
class RegistrationBackend {
 public:
  virtual ~RegistrationBackend() = default;
  // Builds the region for host memory (`owned`: the pinned allocation it then owns, or null).
  virtual std::shared_ptr<MemoryRegion> make_region(uint8_t* addr, uint64_t length,
                                                    uint32_t access,
                                                    std::unique_ptr<PinnedAllocation> owned) = 0;
  // Builds the region for GPU memory (dmabuf_fd >= 0: by dmabuf, else by address).
  virtual std::shared_ptr<MemoryRegion> make_device_region(uint8_t* addr, uint64_t length,
                                                           uint32_t access, int dmabuf_fd,
                                                           uint64_t dmabuf_offset) = 0;
};

class BouncePool;

class MemoryDomain {
 public:
  explicit MemoryDomain(RegistrationBackend& backend);
  ~MemoryDomain();
  MemoryDomain(const MemoryDomain&) = delete;
  MemoryDomain& operator=(const MemoryDomain&) = delete;

  // The access-flag policy: validates Access bits (Error kInvalidArgument on unknown ones) and
  // adds kAccessLocalWrite when peers may write (verbs requires it).
  static uint32_t access_for(uint32_t access);

  // Registers [addr, addr+length) with `access` (access_for applied).
  std::shared_ptr<MemoryRegion> register_memory(uint8_t* addr, uint64_t length, uint32_t access);
  // Allocates page-aligned host memory, locks it (mlock) and registers it with local write.
  std::shared_ptr<MemoryRegion> alloc_pinned(uint64_t length, uint32_t access);
  // Registers GPU memory for GPUDirect RDMA (cuda/gpudirect.h); see Transport. `maker`: the
  // backend that builds the region when not this domain's (the shm companion of an automatic
  // engine exports it for CUDA IPC into its owner's domain: engine/wireup.h).
  std::shared_ptr<MemoryRegion> register_device_memory(uint8_t* addr, uint64_t length,
                                                       uint32_t access, int dmabuf_fd,
                                                       uint64_t dmabuf_offset,
                                                       RegistrationBackend* maker = nullptr);
  // Kills the region's key for new remote accesses, waits (bounded) for in-flight uses, then
  // revokes the region at once (verbs: ibv_dereg_mr), whoever still holds the object. On a
  // timeout (Error kTimeout) the region stays registered with the transport's handle alive.
  void deregister(const std::shared_ptr<MemoryRegion>& region, double timeout_s);

  size_t registered_count() const { return regions_.size(); }
  const RegionTable& regions() const { return regions_; }

  // The staging bounce pool of this domain (bounce_pool.h), made on first use with the
  // configuration of the environment. Throws Error(kClosed) after close_bounce_pool(), and
  // Error(kInvalidArgument) for a bad RDMAXFER_BOUNCE_* variable.
  BouncePool& bounce_pool();
  // Deregisters and frees the pool's free slabs (each wait bounded by `timeout_s`).
  void close_bounce_pool(double timeout_s);

 private:
  RegistrationBackend& backend_;
  RegionTable regions_;
  std::mutex pool_mu_;
  std::unique_ptr<BouncePool> pool_;
  bool pool_closed_ = false;
};

}  // namespace rdmaxfer
