// Control messages of the verbs transport: the two-sided protocol, carried by SENDs into the
// peer's pre-posted control receive buffers (one ring per QP).
//
// Header, 48 bytes, little-endian, version 1, then `meta_len` bytes of metadata, then
// `payload_len` bytes of data (EAGER only); the whole SEND fits the peer's ctrl_size:
//    0 magic u16 0x4352 ("RC")   2 version u8   3 type u8   4 meta_len u32
//    8 msg_id u64 (the sender's request id)   16 size u64 (message bytes)
//   24 addr u64 (CTS: where to write)         32 rkey u32 (CTS)   36 payload_len u32
//   40 reserved u64 (0)
//
//   RTS     msg_id, size, meta: a message waits at the sender (rendezvous)
//   EAGER   like RTS with the data attached (size <= eager limit)
//   CTS     msg_id; for rendezvous addr + rkey of the receiver's buffer. The sender RDMA-WRITEs
//           the message there, the last chunk as WRITE_WITH_IMM with imm = low 32 bits of
//           msg_id, which completes the receive. For EAGER the CTS only acknowledges.
//   REJECT  msg_id, meta = reason: the receiver refused the message.
// Closing uses the bootstrap TCP stream (one GOODBYE byte, or EOF), not a control message.
#pragma once

#include <cstdint>
#include <string>

namespace rdmaxfer {

enum class CtrlType : uint8_t { kRts = 1, kEager = 2, kCts = 3, kReject = 4 };

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

  void encode(uint8_t* out) const;
  // Throws Error(kProtocol) on a bad magic, version, type, or lengths past `available` bytes.
  static CtrlHeader decode(const uint8_t* in, size_t available);
};

const char* ctrl_type_name(CtrlType type);

}  // namespace rdmaxfer
