#include "transport/shm/shm_ring.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace rdmaxfer {

struct ShmRing::Header {
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
  alignas(64) std::atomic<uint32_t> sleeping;
};
static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free,
              "the ring's counters are shared between processes: they must be lock-free");

namespace {
constexpr uint64_t pad8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }
}  // namespace

UniqueFd ShmRing::create(uint64_t capacity) {
  UniqueFd fd(memfd_create("rdmaxfer-shm-ring", MFD_CLOEXEC));
  if (!fd.valid()) throw_errno(ErrorKind::kTransport, "shm: memfd_create", errno);
  if (ftruncate(fd.get(), static_cast<off_t>(kHeaderBytes + capacity)) != 0) {
    throw_errno(ErrorKind::kTransport, "shm: ftruncate of the ring", errno);
  }
  return fd;
}

ShmRing::ShmRing(int memfd, uint64_t capacity, UniqueFd doorbell)
    : capacity_(capacity), doorbell_(std::move(doorbell)) {
  if (capacity == 0 || (capacity & (capacity - 1)) != 0) {
    throw Error(ErrorKind::kProtocol, "shm: ring capacity " + std::to_string(capacity) +
                                          " is not a power of two");
  }
  map_ = mmap(nullptr, kHeaderBytes + capacity, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw_errno(ErrorKind::kTransport, "shm: mmap of the ring", errno);
  }
  header_ = static_cast<Header*>(map_);
  data_ = static_cast<uint8_t*>(map_) + kHeaderBytes;
}

ShmRing::~ShmRing() {
  if (map_ != nullptr) munmap(map_, kHeaderBytes + capacity_);
}

void ShmRing::copy_in(uint64_t pos, const void* data, size_t len) {
  const uint64_t at = pos & (capacity_ - 1);
  const uint64_t first = std::min<uint64_t>(len, capacity_ - at);
  std::memcpy(data_ + at, data, first);
  if (first < len) std::memcpy(data_, static_cast<const uint8_t*>(data) + first, len - first);
}

void ShmRing::copy_out(uint64_t pos, void* data, size_t len) const {
  const uint64_t at = pos & (capacity_ - 1);
  const uint64_t first = std::min<uint64_t>(len, capacity_ - at);
  std::memcpy(data, data_ + at, first);
  if (first < len) std::memcpy(static_cast<uint8_t*>(data) + first, data_, len - first);
}

bool ShmRing::try_push(const void* a, size_t a_len, const void* b, size_t b_len, const void* c,
                       size_t c_len) {
  const uint64_t len = a_len + b_len + c_len;
  const uint64_t need = pad8(4 + len);
  const uint64_t head = header_->head.load(std::memory_order_relaxed);
  const uint64_t tail = header_->tail.load(std::memory_order_acquire);
  if (head - tail > capacity_ || need > capacity_ - (head - tail)) return false;
  const uint32_t len32 = static_cast<uint32_t>(len);
  copy_in(head, &len32, 4);
  if (a_len > 0) copy_in(head + 4, a, a_len);
  if (b_len > 0) copy_in(head + 4 + a_len, b, b_len);
  if (c_len > 0) copy_in(head + 4 + a_len + b_len, c, c_len);
  header_->head.store(head + need, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (header_->sleeping.load(std::memory_order_relaxed) != 0) {
    const uint64_t one = 1;
    // EAGAIN: the counter is saturated, so the consumer wakes anyway.
    if (write(doorbell_.get(), &one, sizeof(one)) < 0 && errno != EAGAIN) {
      throw_errno(ErrorKind::kConnection, "shm: ringing the peer's doorbell", errno);
    }
  }
  return true;
}

bool ShmRing::empty() const {
  return header_->head.load(std::memory_order_acquire) ==
         header_->tail.load(std::memory_order_relaxed);
}

bool ShmRing::try_pop(std::string* out) {
  const uint64_t tail = header_->tail.load(std::memory_order_relaxed);
  const uint64_t head = header_->head.load(std::memory_order_acquire);
  if (head == tail) return false;
  const uint64_t avail = head - tail;
  uint32_t len = 0;
  if (avail < 8 || avail > capacity_) throw Error(ErrorKind::kProtocol, "shm: corrupt ring");
  copy_out(tail, &len, 4);
  const uint64_t need = pad8(4 + uint64_t{len});
  if (need > avail) throw Error(ErrorKind::kProtocol, "shm: corrupt ring record length");
  out->resize(len);
  if (len > 0) copy_out(tail + 4, &(*out)[0], len);
  header_->tail.store(tail + need, std::memory_order_release);
  return true;
}

void ShmRing::set_sleeping(bool sleeping) {
  header_->sleeping.store(sleeping ? 1 : 0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ShmRing::drain_doorbell() {
  uint64_t count = 0;
  // EAGAIN: nothing rang; the record may already be there.
  if (read(doorbell_.get(), &count, sizeof(count)) < 0 && errno != EAGAIN) {
    throw_errno(ErrorKind::kConnection, "shm: reading the doorbell", errno);
  }
}

}  // namespace rdmaxfer
