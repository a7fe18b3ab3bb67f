#include "core/region.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <vector>

#include "common/error.h"
#include "common/random.h"

namespace rdmaxfer {

namespace {
std::string to_hex(uint64_t v) {
  char buf[17];
  snprintf(buf, sizeof(buf), "%llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

std::string memlock_limit_text() {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "unknown";
  if (rl.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(rl.rlim_cur / 1024) + " KiB";
}

void check_mapped(const uint8_t* addr, uint64_t length) {
  if (length == 0) return;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t begin = reinterpret_cast<uint64_t>(addr) / page * page;
  const uint64_t end = reinterpret_cast<uint64_t>(addr) + length;
  constexpr uint64_t kWindowPages = 1 << 16;
  // One byte per page of the first window only: a small registration clears a few bytes, not
  // the whole window's 64 KiB.
  std::vector<unsigned char> residency(std::min((end - begin + page - 1) / page, kWindowPages));
  for (uint64_t at = begin; at < end; at += kWindowPages * page) {
    const uint64_t span = std::min(end - at, kWindowPages * page);
    if (mincore(reinterpret_cast<void*>(at), span, residency.data()) != 0) {
      const int e = errno;
      if (e == ENOMEM) {
        throw Error(ErrorKind::kRegistration,
                    "memory at 0x" + to_hex(reinterpret_cast<uint64_t>(addr)) + " (" +
                        std::to_string(length) +
                        " bytes) is not mapped: it was freed or never allocated; register "
                        "memory that stays alive (the Python layer keeps its owner alive)",
                    e);
      }
      throw Error(ErrorKind::kRegistration, errno_text("mincore", e), e);
    }
  }
}

PinnedAllocation::PinnedAllocation(uint64_t length) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  mapped_ = length == 0 ? page : (length + page - 1) / page * page;
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    throw Error(ErrorKind::kRegistration,
                errno_text("mmap of " + std::to_string(mapped_) + " bytes for a pinned buffer", e),
                e);
  }
  if (mlock(p, mapped_) != 0) {
    int e = errno;
    munmap(p, mapped_);
    throw Error(ErrorKind::kRegistration,
                errno_text("mlock of " + std::to_string(mapped_) + " bytes", e) +
                    "; the locked-memory limit (ulimit -l) is " + memlock_limit_text() +
                    ": raise it (ulimit -l unlimited, or memlock in /etc/security/limits.conf, "
                    "or --ulimit memlock=-1 for containers)",
                e);
  }
  data_ = static_cast<uint8_t*>(p);
}

PinnedAllocation::~PinnedAllocation() {
  if (data_ != nullptr) {
    munlock(data_, mapped_);
    munmap(data_, mapped_);
  }
}

MemoryRegion::MemoryRegion(uint8_t* addr, uint64_t length, uint32_t access,
                           std::unique_ptr<PinnedAllocation> owned)
    : addr_(addr), length_(length), access_(access), owned_(std::move(owned)) {}

MemoryRegion::~MemoryRegion() = default;

bool MemoryRegion::contains(uint64_t addr, uint64_t len) const {
  const uint64_t base = reinterpret_cast<uint64_t>(addr_);
  if (addr < base) return false;
  const uint64_t off = addr - base;
  return off <= length_ && len <= length_ - off;
}

void MemoryRegion::add_use() {
  std::lock_guard<std::mutex> lock(mu_);
  ++uses_;
}

void MemoryRegion::drop_use() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--uses_ == 0) cv_.notify_all();
}

bool MemoryRegion::wait_unused(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                      [this] { return uses_ == 0; });
}

int MemoryRegion::uses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return uses_;
}

void MemoryRegion::revoke() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (revoked_) return;
    revoked_ = true;
  }
  release_handle();
}

bool MemoryRegion::revoked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return revoked_;
}

void check_local_range(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                       uint64_t length, const char* what, LocalUse use) {
  if (!local) throw Error(ErrorKind::kInvalidArgument, std::string(what) + ": no local region");
  if (local->revoked()) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + ": the local region (key " + std::to_string(local->key()) +
                    ") was deregistered; register the memory again");
  }
  if (use == LocalUse::kDestination && !local->local_write()) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + ": the local region (" + std::to_string(local->length()) +
                    " bytes at 0x" + to_hex(reinterpret_cast<uint64_t>(local->addr())) +
                    ") is registered without local write access (read-only memory, or "
                    "registered only as a source), so nothing can be received into it; nothing "
                    "was posted: pass writable memory as the destination");
  }
  if (offset > local->length() || length > local->length() - offset) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + ": local range offset " + std::to_string(offset) + " + " +
                    std::to_string(length) + " bytes exceeds the local region of " +
                    std::to_string(local->length()) + " bytes");
  }
}

RegionUse::RegionUse(std::shared_ptr<MemoryRegion> region) : region_(std::move(region)) {
  if (region_) region_->add_use();
}

RegionUse& RegionUse::operator=(RegionUse&& other) noexcept {
  if (this != &other) {
    release();
    region_ = std::move(other.region_);
  }
  return *this;
}

RegionUse::~RegionUse() { release(); }

void RegionUse::release() {
  if (region_) {
    region_->drop_use();
    region_.reset();
  }
}

const char* access_status_text(AccessStatus status) {
  switch (status) {
    case AccessStatus::kOk: return "ok";
    case AccessStatus::kUnknownKey:
      return "no registered region has this key (never registered, or deregistered)";
    case AccessStatus::kOutOfBounds: return "the range lies outside the registered region";
    case AccessStatus::kNotPermitted: return "the region does not allow this access";
    case AccessStatus::kNotCpuAddressable:
      return "the region is GPU memory shared by CUDA IPC, which only peers on its host reach "
             "(over shm); register host memory for peers on other hosts";
  }
  return "unknown access status";
}

void RegionTable::insert(const std::shared_ptr<MemoryRegion>& region) {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t key = region->key();
  if (key == 0 || regions_.count(key) != 0) {
    while (key == 0 || regions_.count(key) != 0) key = random_u32();
    region->set_key(key);
  }
  regions_.emplace(key, region);
}

bool RegionTable::erase(uint32_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  return regions_.erase(key) != 0;
}

AccessStatus RegionTable::acquire(uint32_t key, uint64_t addr, uint64_t len, uint32_t needed,
                                  RegionUse* use, bool by_cpu) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(key);
  if (it == regions_.end()) return AccessStatus::kUnknownKey;
  const auto& region = it->second;
  if ((region->access() & needed) != needed) return AccessStatus::kNotPermitted;
  if (by_cpu && !region->cpu_addressable()) return AccessStatus::kNotCpuAddressable;
  if (!region->contains(addr, len)) return AccessStatus::kOutOfBounds;
  *use = RegionUse(region);
  return AccessStatus::kOk;
}

size_t RegionTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return regions_.size();
}

}  // namespace rdmaxfer
