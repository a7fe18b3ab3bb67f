// One direction of the shm transport's control path: a single-producer single-consumer ring of
// records in a memfd (shared with the peer over SCM_RIGHTS, never named in /dev/shm), with an
// eventfd doorbell the producer rings only when the consumer said it is going to sleep.
//
// Layout: a 4 KiB header (head: bytes ever produced, tail: bytes ever consumed, each on its own
// cache line; sleeping: the consumer's flag), then `capacity` bytes (a power of two). A record is
// a u32 length and its bytes, padded to 8. The consumer checks every length it reads: a peer
// that corrupts the ring gets a protocol error, never an out-of-bounds access.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/unique_fd.h"

namespace rdmaxfer {

class ShmRing {
 public:
  static constexpr uint64_t kHeaderBytes = 4096;
  // Makes the memfd (header + capacity bytes, zeroed); throws Error(kTransport).
  static UniqueFd create(uint64_t capacity);
  // Maps `memfd` (its size must be kHeaderBytes + capacity) and owns `doorbell` (an eventfd).
  ShmRing(int memfd, uint64_t capacity, UniqueFd doorbell);
  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  // Producer: appends one record made of the parts a, b and c; false when the ring has no
  // room now. Rings the doorbell when the consumer sleeps.
  bool try_push(const void* a, size_t a_len, const void* b, size_t b_len, const void* c,
                size_t c_len);
  // Largest record try_push can ever take.
  uint64_t max_record() const { return capacity_ / 2; }

  // Consumer: takes the next record into *out; false when empty. Throws Error(kProtocol) on a
  // corrupt ring.
  bool try_pop(std::string* out);
  bool empty() const;
  // Consumer: announce sleep (then check empty() once more before sleeping) or waking.
  void set_sleeping(bool sleeping);
  int doorbell_fd() const { return doorbell_.get(); }
  // Consumer: clears the doorbell after a wake.
  void drain_doorbell();

 private:
  struct Header;
  void copy_in(uint64_t pos, const void* data, size_t len);
  void copy_out(uint64_t pos, void* data, size_t len) const;

  uint64_t capacity_;
  UniqueFd doorbell_;
  void* map_ = nullptr;
  Header* header_ = nullptr;
  uint8_t* data_ = nullptr;
};

}  // namespace rdmaxfer
