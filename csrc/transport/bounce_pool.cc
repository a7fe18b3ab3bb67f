#include "transport/bounce_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "cuda/cuda_api.h"
#include "cuda/cuda_memory.h"
#include "transport/memory_domain.h"

namespace rdmaxfer {

namespace {

constexpr auto kWaitSlice = std::chrono::milliseconds(20);

std::string mib(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

uint64_t env_bytes(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v == 0 || text[0] == '-') {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(name) + "='" + text + "' must be a whole number of bytes > 0");
  }
  return v;
}

// Page-locked by the CUDA driver (cuMemHostAlloc, portable to every context).
class PinnedSlab : public BounceSlab {
 public:
  explicit PinnedSlab(uint64_t length)
      : BounceSlab(length), memory_(CudaContext::get(0), length) {}
  uint8_t* data() const override { return memory_.data(); }

 private:
  PinnedHostAllocation memory_;
};

// Page-aligned host memory (no CUDA driver: the host stand-in copier's "device").
class HostSlab : public BounceSlab {
 public:
  explicit HostSlab(uint64_t length) : BounceSlab(length) {
    void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      throw Error(ErrorKind::kRegistration,
                  errno_text("mmap of a " + mib(length) + " bounce slab", e), e);
    }
    data_ = static_cast<uint8_t*>(p);
  }
  ~HostSlab() override { munmap(data_, length()); }
  HostSlab(const HostSlab&) = delete;
  HostSlab& operator=(const HostSlab&) = delete;
  uint8_t* data() const override { return data_; }

 private:
  uint8_t* data_ = nullptr;
};

}  // namespace

BouncePoolConfig BouncePoolConfig::from_env() {
  BouncePoolConfig c;
  c.slab_bytes = env_bytes(kSlabEnv, kDefaultSlabBytes);
  c.max_bytes = env_bytes(kPoolEnv, kDefaultPoolBytes);
  return c;
}

BouncePool::BouncePool(MemoryDomain& domain, const BouncePoolConfig& config)
    : domain_(domain),
      slab_bytes_(config.slab_bytes),
      max_slabs_(std::max<uint64_t>(1, config.max_bytes / std::max<uint64_t>(1, config.slab_bytes))) {
  if (slab_bytes_ == 0) throw Error(ErrorKind::kInvalidArgument, "bounce slabs of 0 bytes");
  counts_.slab_bytes = slab_bytes_;
  counts_.max_slabs = max_slabs_;
}

BouncePool::~BouncePool() {
  // A stranded slab may still be the target of a late transfer: never free it.
  for (auto& s : stranded_) static_cast<void>(s.release());
}

std::vector<std::unique_ptr<BounceSlab>> BouncePool::acquire(int count, const Deadline& deadline,
                                                             const std::function<void()>& stop) {
  if (count < 1 || static_cast<uint64_t>(count) > max_slabs_) {
    throw Error(ErrorKind::kInvalidArgument,
                "bounce pool: " + std::to_string(count) + " slabs asked, must be 1.." +
                    std::to_string(max_slabs_));
  }
  const uint64_t want = static_cast<uint64_t>(count);
  std::vector<std::unique_ptr<BounceSlab>> taken;
  uint64_t to_make = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    bool waited = false;
    for (;;) {
      if (closed_) throw Error(ErrorKind::kClosed, "bounce pool: the engine is closed");
      if (free_.size() + (max_slabs_ - slabs_) >= want) break;
      if (!waited) {
        waited = true;
        ++counts_.waits;
      }
      if (deadline.expired()) {
        ++counts_.timeouts;
        throw Error(ErrorKind::kTimeout,
                    "no bounce slab came free for " + seconds_text(deadline.timeout_s()) +
                        " s: all " + std::to_string(max_slabs_) + " slabs of " +
                        mib(slab_bytes_) + " in the engine's bounce pool (" +
                        mib(max_slabs_ * slab_bytes_) + ", " + BouncePoolConfig::kPoolEnv +
                        ") are in use by other staged transfers; raise " +
                        BouncePoolConfig::kPoolEnv +
                        " (bytes) or run fewer staged transfers at once");
      }
      lock.unlock();
      stop();
      lock.lock();
      const auto left = std::chrono::milliseconds(std::max(1, deadline.remaining_ms(20)));
      returned_.wait_for(lock, std::min<std::chrono::milliseconds>(kWaitSlice, left));
    }
    while (taken.size() < want && !free_.empty()) {
      taken.push_back(std::move(free_.back()));
      free_.pop_back();
    }
    to_make = want - taken.size();
    slabs_ += to_make;  // reserved: nobody else can take these places
    counts_.peak_slabs = std::max(counts_.peak_slabs, slabs_);
    ++counts_.acquires;
  }
  try {
    for (; to_make > 0; --to_make) taken.push_back(make_slab());
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      slabs_ -= to_make;
    }
    for (auto& s : taken) release(std::move(s), false);
    returned_.notify_all();
    throw;
  }
  return taken;
}

std::unique_ptr<BounceSlab> BouncePool::make_slab() {
  const uint64_t length = slab_bytes_;
  std::unique_ptr<BounceSlab> slab;
  if (cuda_api(nullptr) != nullptr) {
    slab = std::make_unique<PinnedSlab>(length);
  } else {
    slab = std::make_unique<HostSlab>(length);
  }
  try {
    slab->region_ = domain_.register_memory(slab->data(), length, kAccessLocalWrite);
  } catch (const Error& e) {
    throw Error(e.kind(), "registering a " + mib(length) + " bounce buffer: " + e.what(),
                e.err_no());
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_.allocations;
  return slab;
}

void BouncePool::release(std::unique_ptr<BounceSlab> slab, bool in_use) {
  if (!slab) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_use) {
      --slabs_;  // its place can be taken by a new slab
      stranded_.push_back(std::move(slab));
    } else if (!closed_) {
      free_.push_back(std::move(slab));
    }
  }
  returned_.notify_all();
  if (slab) free_slab(std::move(slab), 5.0);
}

void BouncePool::free_slab(std::unique_ptr<BounceSlab> slab, double timeout_s) {
  bool freed = true;
  try {
    domain_.deregister(slab->region_, timeout_s);
  } catch (const Error&) {
    freed = false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  --slabs_;
  if (!freed) stranded_.push_back(std::move(slab));
}

void BouncePool::close(double timeout_s) {
  std::vector<std::unique_ptr<BounceSlab>> free;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    free.swap(free_);
  }
  returned_.notify_all();
  for (auto& s : free) free_slab(std::move(s), timeout_s);
}

BouncePoolStats BouncePool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  BouncePoolStats s = counts_;
  s.slabs = slabs_;
  s.free = free_.size();
  s.stranded = stranded_.size();
  return s;
}

}  // namespace rdmaxfer
