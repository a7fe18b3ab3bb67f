#include "transport/transport.h"

#include "common/error.h"

namespace rdmaxfer {

std::shared_ptr<MemoryRegion> Transport::register_memory(uint8_t* addr, uint64_t length,
                                                         uint32_t access) {
  if (addr == nullptr && length > 0) {
    throw Error(ErrorKind::kInvalidArgument, "cannot register a null address");
  }
  if ((access & ~(kAccessRemoteRead | kAccessRemoteWrite)) != 0) {
    throw Error(ErrorKind::kInvalidArgument, "unknown access bits " + std::to_string(access));
  }
  auto region = make_region(addr, length, access, nullptr);
  regions_.insert(region);
  return region;
}

std::shared_ptr<MemoryRegion> Transport::alloc_pinned(uint64_t length, uint32_t access) {
  auto owned = std::make_unique<PinnedAllocation>(length);
  uint8_t* data = owned->data();
  auto region = make_region(data, length, access, std::move(owned));
  regions_.insert(region);
  return region;
}

void Transport::deregister(const std::shared_ptr<MemoryRegion>& region, double timeout_s) {
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
}

Descriptor Transport::describe_region(const MemoryRegion& region) const {
  Descriptor d;
  d.transport = capabilities().kind;
  d.access = region.access();
  d.addr = reinterpret_cast<uint64_t>(region.addr());
  d.length = region.length();
  d.key = region.key();
  d.engine_id = engine_id_;
  return d;
}

}  // namespace rdmaxfer
