// Control messages (transport/ctrl_message.h) on the verbs transport: SENDs into the peer's
// pre-posted control receive buffers (one ring per QP).
//
// Header, 48 bytes, little-endian, version 1, then `meta_len` bytes of metadata, then
// `payload_len` bytes of data (EAGER only); the whole SEND fits the peer's ctrl_size:
//    0 magic u16 0x4352 ("RC")   2 version u8   3 type u8   4 meta_len u32
//    8 msg_id u64 (the sender's request id)   16 size u64 (message bytes)
//   24 addr u64 (CTS: where to write)   32 rkey u32 (CTS; NOTIFY: an int payload)
//   36 payload_len u32
//   40 reserved u64 (0)
//
// The types are ctrl_message.h's; a rendezvous CTS carries the receiver's grant as addr + rkey,
// and the sender RDMA-WRITEs the message there, the last chunk as WRITE_WITH_IMM with imm =
// low 32 bits of msg_id, which completes the receive.
// Closing uses the bootstrap TCP stream (one GOODBYE byte, or EOF), not a control message.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/ctrl_message.h"

namespace rdmaxfer {

struct CtrlHeader {
  static constexpr size_t kSize = 48;
  static constexpr uint8_t kVersion = 1;

  CtrlType type = CtrlType::kRts;
  uint32_t meta_len = 0;
  uint64_t msg_id = 0;
  uint64_t size = 0;
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t payload_len = 0;

  // The header of `message` carrying `payload_len` bytes of data after its metadata.
  static CtrlHeader of(const CtrlMessage& message, uint64_t payload_len);
  // The message whose header this is; `body` is what follows the header.
  CtrlMessage message(const uint8_t* body) const;

  void encode(uint8_t* out) const;
  // Throws Error(kProtocol) on a bad magic, version, type, or lengths past `available` bytes.
  static CtrlHeader decode(const uint8_t* in, size_t available);
};

}  // namespace rdmaxfer
