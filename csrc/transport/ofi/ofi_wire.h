// The records the ofi transport sends over its bootstrap stream (transport/bootstrap.h).
//
// After the bootstrap handshake (and authentication) each side sends its endpoint record, then
// a READY byte once the peer's addresses are in its address vectors. Little-endian; version 1
// for an engine of one rail, version 2 for more:
//   0 magic "RXOF"  4 version u16  6 addr_len u16 (<= 1024)  8 max_msg u64 (the smallest
//   max_msg_size of the engine's endpoints)  16 provider_len u16 (<= 255)
//  18 extra_rails u8 (version 2: 1..7; version 1: 0)  19 reserved u8 (0)
//  20 extra_len u32 (version 2: the bytes of the extra rails' block; version 1: 0)
//  24 rail 0's endpoint address (fi_getname, addr_len bytes), then the provider's name
//     (printable ASCII), then
//     (version 2) per extra rail: its address's length u16 (1..1024), then the address.
//
// The stream then carries the control messages of the two-sided protocol
// (transport/ctrl_message.h), in order, and tells each side when the other is gone (EOF); the
// bytes of one-sided operations and notifications travel over the fabric. A frame is a 48-byte
// header, then `meta_len` bytes of metadata and `data_len` bytes of EAGER data:
//   0 kind u8 (1 control message, 2 goodbye, 3 rail down: route = the sender's rail that
//     failed, meta = why; 4-7 a failed rail rejoining, ofi_heal.cc: 4 rejoin, 5 rejoin ok,
//     6 rejoin refused (meta = why), 7 rail up, each with route = the rail, msg_id = the
//     attempt, and for 4 and 5 addr, key and size = where the sender's probe word is (its
//     address on the fabric, its key on that rail) and its value)
//   1 ctrl type u8  2 reserved u16  4 meta_len u32
//   8 msg_id u64  16 size u64  24 addr u64  32 key u32  36 route u32  40 data_len u32
//  44 reserved u32
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/ctrl_message.h"

namespace rdmaxfer {

struct OfiEndpointRecord {
  static constexpr size_t kHeaderSize = 24;
  static constexpr uint16_t kVersion = 1;
  static constexpr uint16_t kVersionRails = 2;
  static constexpr size_t kMaxRails = 8;
  static constexpr size_t kMaxAddress = 1024;
  static constexpr size_t kMaxProvider = 255;
  static constexpr uint8_t kReadyByte = 0x52;
  std::vector<std::string> addresses;  // fi_getname of each rail's endpoint, rail 0 first
  uint64_t max_msg = 0;  // ep_attr->max_msg_size
  std::string provider;  // fabric_attr->prov_name

  std::string pack() const;
  // The full record's size from its header; throws Error(kProtocol) on a bad header.
  static size_t peek_size(const uint8_t* header);
  static OfiEndpointRecord unpack(const uint8_t* data, size_t size);  // Error(kProtocol)
};

enum class OfiFrameKind : uint8_t {
  kCtrl = 1,
  kGoodbye = 2,
  kRailDown = 3,
  kRejoin = 4,
  kRejoinOk = 5,
  kRejoinNo = 6,
  kRailUp = 7,
};

struct OfiFrameHeader {
  static constexpr size_t kSize = 48;
  static constexpr uint32_t kMaxMeta = 64 * 1024;
  static constexpr uint32_t kMaxData = 64 * 1024;
  OfiFrameKind kind = OfiFrameKind::kCtrl;
  CtrlMessage message;  // type, msg_id, size, addr, key, route (meta and data follow)
  uint32_t meta_len = 0;
  uint32_t data_len = 0;

  void pack(uint8_t* out) const;
  static OfiFrameHeader unpack(const uint8_t* in);  // throws Error(kProtocol)
};

}  // namespace rdmaxfer
