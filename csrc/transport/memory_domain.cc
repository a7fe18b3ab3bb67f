#include "transport/memory_domain.h"

#include "common/error.h"
#include "transport/bounce_pool.h"

namespace rdmaxfer {

MemoryDomain::MemoryDomain(RegistrationBackend& backend) : backend_(backend) {}

MemoryDomain::~MemoryDomain() = default;

BouncePool& MemoryDomain::bounce_pool() {
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (pool_closed_) throw Error(ErrorKind::kClosed, "bounce pool: the engine is closed");
  if (!pool_) pool_ = std::make_unique<BouncePool>(*this, BouncePoolConfig::from_env());
  return *pool_;
}

void MemoryDomain::close_bounce_pool(double timeout_s) {
  BouncePool* pool = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    pool_closed_ = true;
    pool = pool_.get();
  }
  if (pool != nullptr) pool->close(timeout_s);
}

uint32_t MemoryDomain::access_for(uint32_t access) {
  if ((access & ~(kAccessRemoteMask | kAccessLocalWrite)) != 0) {
    throw Error(ErrorKind::kInvalidArgument, "unknown access bits " + std::to_string(access));
  }
  return (access & kAccessRemoteWrite) != 0 ? access | kAccessLocalWrite : access;
}

std::shared_ptr<MemoryRegion> MemoryDomain::register_memory(uint8_t* addr, uint64_t length,
                                                            uint32_t access) {
  if (addr == nullptr && length > 0) {
    throw Error(ErrorKind::kInvalidArgument, "cannot register a null address");
  }
  auto region = backend_.make_region(addr, length, access_for(access), nullptr);
  regions_.insert(region);
  return region;
}

std::shared_ptr<MemoryRegion> MemoryDomain::alloc_pinned(uint64_t length, uint32_t access) {
  auto owned = std::make_unique<PinnedAllocation>(length);
  uint8_t* data = owned->data();
  // The engine's own memory is writable: it may always be a destination.
  auto region =
      backend_.make_region(data, length, access_for(access) | kAccessLocalWrite, std::move(owned));
  regions_.insert(region);
  return region;
}

std::shared_ptr<MemoryRegion> MemoryDomain::register_device_memory(uint8_t* addr,
                                                                   uint64_t length,
                                                                   uint32_t access, int dmabuf_fd,
                                                                   uint64_t dmabuf_offset,
                                                                   RegistrationBackend* maker) {
  if (addr == nullptr) throw Error(ErrorKind::kInvalidArgument, "cannot register a null address");
  RegistrationBackend& backend = maker != nullptr ? *maker : backend_;
  auto region =
      backend.make_device_region(addr, length, access_for(access), dmabuf_fd, dmabuf_offset);
  regions_.insert(region);
  return region;
}

void MemoryDomain::deregister(const std::shared_ptr<MemoryRegion>& region, double timeout_s) {
  if (!regions_.erase(region->key())) {
    throw Error(ErrorKind::kInvalidArgument,
                "region with key " + std::to_string(region->key()) +
                    " is not registered (already deregistered?)");
  }
  if (!region->wait_unused(timeout_s)) {
    throw Error(ErrorKind::kTimeout,
                "deregister: " + std::to_string(region->uses()) +
                    " operations still use the region after " + std::to_string(timeout_s) +
                    " s; wait for or close the endpoints that use it");
  }
  region->revoke();
}

}  // namespace rdmaxfer
