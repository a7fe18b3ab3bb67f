#include "transport/rdma/buffer_slab.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"

namespace rdmaxfer {

BufferSlab::BufferSlab(std::shared_ptr<ProtectionDomain> pd, uint32_t slot_size, uint32_t count)
    : slot_size_(slot_size), count_(count) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t bytes = static_cast<uint64_t>(slot_size) * count;
  mapped_ = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw_errno(ErrorKind::kRegistration,
                "mmap of " + std::to_string(mapped_) + " bytes for control buffers", errno);
  }
  base_ = static_cast<uint8_t*>(p);
  try {
    mr_ = std::make_unique<VerbsMr>(std::move(pd), base_, mapped_, IBV_ACCESS_LOCAL_WRITE);
  } catch (...) {
    munmap(base_, mapped_);
    throw;
  }
}

void BufferSlab::register_in(std::shared_ptr<ProtectionDomain> pd) {
  mr_ = std::make_unique<VerbsMr>(std::move(pd), base_, mapped_, IBV_ACCESS_LOCAL_WRITE);
}

BufferSlab::~BufferSlab() {
  mr_.reset();
  munmap(base_, mapped_);
}

}  // namespace rdmaxfer
