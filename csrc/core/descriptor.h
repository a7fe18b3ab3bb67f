// A descriptor names a registered remote region: what a peer needs to READ or WRITE it.
//
// Wire record, little-endian; version 1 (40 bytes) for a region on one rail, version 2 (40 + 4n
// bytes) for one registered on n more rails (a verbs engine on several devices, rdma_rails.h):
//   0  magic   "RXMR"         4  version u16       6  transport u8   7  access u8
//   8  addr    u64           16  length  u64      24  key u32 (rail 0)
//  28  n u8 (version 2: the extra rail keys that follow; version 1: 0)
//  29  generation u16 (version 2; version 1: 0): how many times a device of the registering
//      engine had come back when the keys were read (a verbs rail removed and added back gives
//      its memory new rkeys there: a peer uses a rail's key only from a descriptor at least as
//      new as that rail's return, transport/rdma/rdma_transport.h)   31  reserved u8 (0)
//  32  engine_id u64 (the engine that registered the region)
//  40  version 2 only: key u32 on rail 1, rail 2, ... (n of them)
// Never pickled: unpack() checks every field and raises a protocol error on anything else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/transport_ids.h"

namespace rdmaxfer {

struct Descriptor {
  static constexpr size_t kSize = 40;  // version 1; version 2 adds 4 bytes per extra rail
  static constexpr uint16_t kVersion = 1;
  static constexpr uint16_t kVersionRails = 2;
  static constexpr size_t kMaxRailKeys = 255;

  uint8_t transport = 0;  // the registering transport's wire id (core/transport_ids.h)
  uint32_t access = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t key = 0;
  uint64_t engine_id = 0;
  std::vector<uint32_t> rail_keys;  // the keys on rails 1, 2, ... (verbs: one rkey per device)
  uint16_t generation = 0;          // see above

  // The key on `rail` (0: key), or 0 when the region has none there.
  uint32_t key_on(size_t rail) const {
    return rail == 0 ? key : rail <= rail_keys.size() ? rail_keys[rail - 1] : 0;
  }
  std::string pack() const;
  // Throws Error(kProtocol) naming the first bad field.
  static Descriptor unpack(const uint8_t* data, size_t size);
};

// An engine id as messages show it: 16 hex digits ("8e9346695a295d62").
std::string engine_id_text(uint64_t engine_id);

// Throws Error(kInvalidArgument) unless [remote.addr + remote_offset, + length) lies inside the
// region the descriptor names (overflow-safe). Both transports check a one-sided request with
// this before posting anything, so a request that reaches outside is refused whole: no byte
// lands and the connection stays up. (The target still checks every access it serves.)
void check_remote_range(const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                        const char* what);

}  // namespace rdmaxfer
