// Control messages (transport/ctrl_message.h) on the verbs transport: SENDs into the peer's
// pre-posted control receive buffers (one ring per QP).
//
// Header, 48 bytes, little-endian, version 1, then `meta_len` bytes of metadata, then
// `payload_len` bytes of data (EAGER only); the whole SEND fits the peer's ctrl_size:
//    0 magic u16 0x4352 ("RC")   2 version u8   3 type u8   4 meta_len u32
//    8 msg_id u64 (the sender's request id)   16 size u64 (message bytes)
//   24 addr u64 (CTS: where to write)   32 rkey u32 (CTS; NOTIFY: an int payload)
//   36 payload_len u32
//   40 seq u48: the sender's number for this control SEND, counting from 1 on each connection
//      (0: not numbered). A SEND sent again after a failover (its ACK lost with the failed
//      rail, rdma_connection.h) keeps its number, and the receiver hands each number up once.
//   46 grant rail u8 (CTS: the route of the grant, the sender's rail whose PD holds the rkey;
//      the WRITEs go on a QP paired with it)   47 reserved u8 (0)
//
// The types are ctrl_message.h's; a rendezvous CTS carries the receiver's grant as addr + rkey
// + grant rail, and the sender RDMA-WRITEs the message there, the last chunk as WRITE_WITH_IMM
// with imm = low 32 bits of msg_id, which completes the receive.
// One type is the verbs transport's own, handled there and never handed to the protocol:
//   RAIL_DOWN  addr = the sender's rail (index in its endpoint record) whose side failed: its
//              port down, its device removed or a QP there in error; meta = the cause (at most
//              kRailDownCauseMax bytes). The receiver fails over its lanes paired with that
//              rail (rdma_connection.h). Sent at most once per rail for a connection's life,
//              outside the credit window: the receive buffers hold 4x the window (window =
//              ctrl_depth / 4, rdma_connection.cc), and with an SRQ they grow on demand.
// Five more are the verbs transport's, for a failed rail that heals (rdma_healing.cc). In the
// first four `addr` is the connector's attempt number and `meta` the sender's rail (24 bytes:
// GID 16, LID u16, active MTU u8, reserved u8, generation u16 (endpoint_record.h), reserved
// u16) then a list of 16-byte entries, one per QP (u32 lane index, the same on both sides
// (rdma_connection.h), u32 QPN of the sender's QP, u32 QPN of the receiver's QP it pairs with
// as the sender knows it, u32 the sender's new PSN), little-endian:
//   REJOIN      connector -> acceptor: these QPs of mine were reset (or created again: their
//               device came back) with these PSNs; reset yours
//   REJOIN_ACK  acceptor -> connector: done, mine are in RTS with these PSNs
//   REJOIN_NAK  acceptor -> connector: not now; meta = the cause, rkey = 1 when it is for good
//   RAIL_UP     connector -> acceptor: my probe WRITE on each of these QPs completed; they carry
//               traffic again
//   RAIL_BACK   acceptor -> connector: the device of my rail `addr` came back; try now
// Like RAIL_DOWN, each is sent once per attempt, outside the credit window.
// Closing uses the bootstrap TCP stream (one GOODBYE byte, or EOF), not a control message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>

#include "transport/ctrl_message.h"

namespace rdmaxfer {

constexpr CtrlType kCtrlRailDown = static_cast<CtrlType>(0x40);
constexpr size_t kRailDownCauseMax = 512;
constexpr CtrlType kCtrlRejoin = static_cast<CtrlType>(0x41);
constexpr CtrlType kCtrlRejoinAck = static_cast<CtrlType>(0x42);
constexpr CtrlType kCtrlRejoinNak = static_cast<CtrlType>(0x43);
constexpr CtrlType kCtrlRailUp = static_cast<CtrlType>(0x44);
constexpr CtrlType kCtrlRailBack = static_cast<CtrlType>(0x45);

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
  uint64_t seq = 0;  // < 2^48
  uint8_t grant_rail = 0;

  // The header of `message` carrying `payload_len` bytes of data after its metadata.
  static CtrlHeader of(const CtrlMessage& message, uint64_t payload_len);
  // The message whose header this is; `body` is what follows the header.
  CtrlMessage message(const uint8_t* body) const;

  void encode(uint8_t* out) const;
  // Throws Error(kProtocol) on a bad magic, version, type, or lengths past `available` bytes.
  static CtrlHeader decode(const uint8_t* in, size_t available);
};

// The control SEND numbers (CtrlHeader::seq) a receiver has handed up: every one below
// `below_`, and those above it in `above_` (out of order only after a failover, until the
// gap fills). Not thread-safe.
class CtrlSeqFilter {
 public:
  // True the first time `seq` comes (and always for 0, not numbered); false for a repeat.
  bool first(uint64_t seq);

 private:
  // A gap with this many numbers past it: its number was lost for good, the filter skips it.
  static constexpr size_t kMaxAbove = 4096;
  void advance();  // moves below_ over the numbers in above_ that follow it
  uint64_t below_ = 1;
  std::set<uint64_t> above_;
};

}  // namespace rdmaxfer
