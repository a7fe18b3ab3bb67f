// The grants of one channel (channel.h: grant/release_grant): the buffers the peer may write one
// message into, by the key the peer names them with. Written once for every transport that
// keeps its grants in memory (tcp, shm, loopback; verbs grants are MRs). Not locked: the channel
// guards it with its own lock.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "core/region.h"
#include "core/request.h"
#include "transport/ctrl_message.h"

namespace rdmaxfer {

struct GrantEntry {
  std::shared_ptr<MemoryRegion> region;
  uint8_t* base = nullptr;  // local->addr() + offset
  uint64_t length = 0;
  uint32_t value = 0;       // the notification the peer's write must carry
  RequestPtr progress;      // counts the bytes landing (may be null)
  uint64_t received = 0;    // bytes landed so far (for transports that land in pieces)
};

class GrantTable {
 public:
  // Grants local[offset, offset + length) under a fresh key (never 0, never one in use); the
  // Grant's id and key are that key (route 0: one path).
  Grant add(const std::shared_ptr<MemoryRegion>& local, uint64_t offset, uint64_t length,
            uint32_t value, RequestPtr progress) {
    uint32_t key = next_++;
    while (key == 0 || entries_.count(key) != 0) key = next_++;
    uint8_t* base = local->addr() + offset;
    entries_[key] = GrantEntry{local, base, length, value, std::move(progress), 0};
    return Grant{key, reinterpret_cast<uint64_t>(base), key};
  }
  // The grant named `key`, or nullptr.
  GrantEntry* find(uint32_t key) {
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second;
  }
  void release(uint64_t id) { entries_.erase(static_cast<uint32_t>(id)); }
  void clear() { entries_.clear(); }

 private:
  std::unordered_map<uint32_t, GrantEntry> entries_;
  uint32_t next_ = 1;
};

}  // namespace rdmaxfer
