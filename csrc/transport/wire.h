// The frames of the stream transports, shared by every transport that uses them (tcp over its
// sockets, shm over its rings). Every frame is a 64-byte header, then `meta_len` bytes of
// metadata, then `payload_len` bytes of data. Little-endian, version 1:
//   0 magic u16 0x5852 ("RX")  2 version u8  3 type u8  4 status u32  8 req_id u64
//  16 addr u64  24 size u64  32 aux u64  40 key u32  44 meta_len u32  48 payload_len u64
//  56 total u64
//
// Frame types and their fields:
//   WRITE      req_id, addr (target address of this chunk), key, aux (offset of the chunk in
//              the request), total (request bytes); data follows. The target checks the whole
//              request range [addr - aux, addr - aux + total) for every chunk, so a request
//              that reaches outside the region is refused whole and changes nothing.
//   WRITE_ACK  req_id, aux, size, status (AccessStatus)
//   READ_REQ   req_id, addr, key, size (bytes wanted), aux, total (checked like WRITE)
//   READ_RESP  req_id, aux, status; data follows when status is 0
//   MSG_RTS    req_id (message id), size (message bytes), meta (sender's metadata)
//   MSG_EAGER  like MSG_RTS with the data attached (small messages)
//   MSG_CTS    req_id, size, addr, key: the receiver granted its buffer (key names the grant;
//              0 for an EAGER message, which is only acknowledged)
//   MSG_REJECT req_id, meta (reason): the receiver refused the message
//   MSG_DATA   req_id (the notification value), key (the grant), addr, aux (offset in the
//              message), total (message bytes); data follows. Checked against the grant: a
//              chunk outside it, or for no grant, closes the connection.
//   MSG_NOTIFY req_id, size (1: an int payload in key; 0: bytes in meta)
//   WRITE_GATHER      req_id, aux (pieces), total (data bytes); meta: per piece addr u64,
//                     length u64, key u32, 0 u32 (kGatherPieceMeta bytes); data: the pieces'
//                     bytes one after another. The target checks each piece on its own (inside
//                     one region registered for remote writes) and places those that pass.
//   WRITE_GATHER_ACK  req_id, size (data bytes), status (0: every piece placed; else meta
//                     holds one AccessStatus byte per piece)
//   READ_GATHER       req_id, aux (pieces), size (bytes of all pieces); meta as WRITE_GATHER;
//                     no data. The target checks each piece on its own (for remote reads).
//   READ_GATHER_RESP  req_id, size, status (as WRITE_GATHER_ACK); data: the bytes of the
//                     pieces accepted, one after another (none for a refused piece)
// On shm (shm/shm_channel.h) WRITE_GATHER and READ_GATHER records carry their list as data
// instead (kShmPieceBytes each: target address u64, length u64, key u32, 0 u32, initiator
// address u64) and no bytes; the target copies them and answers WRITE_GATHER_ACK (for both;
// on a failed copy, aux holds its errno and the pieces' statuses mark it kCopyFailed).
// The MSG_* frames carry the control messages of transport/ctrl_message.h.
//   GOODBYE    the peer closes the connection on purpose
#pragma once

#include <cstdint>
#include <string>

#include "transport/ctrl_message.h"

namespace rdmaxfer {

enum class FrameType : uint8_t {
  kWrite = 1,
  kWriteAck = 2,
  kReadReq = 3,
  kReadResp = 4,
  kMsgRts = 5,
  kMsgEager = 6,
  kMsgCts = 7,
  kMsgReject = 8,
  kMsgData = 9,
  kGoodbye = 10,
  kMsgNotify = 11,
  kWriteGather = 12,
  kWriteGatherAck = 13,
  kMsgAbort = 14,
  kReadGather = 15,
  kReadGatherResp = 16,
};
const char* frame_type_name(FrameType type);
// The frame that carries a control message of `type`, and back (for the kMsg* control frames:
// RTS, EAGER, CTS, REJECT, NOTIFY, ABORT; shared by the TCP and shm channels).
FrameType frame_type_of(CtrlType type);
CtrlType ctrl_type_of(FrameType type);

// Bytes of WRITE_GATHER / READ_GATHER metadata per piece; of a shm record's piece.
constexpr uint32_t kGatherPieceMeta = 24;
constexpr uint32_t kShmPieceBytes = 32;

struct FrameHeader {
  static constexpr size_t kSize = 64;
  static constexpr uint8_t kVersion = 1;
  static constexpr uint32_t kMaxMeta = 64 * 1024;

  FrameType type = FrameType::kGoodbye;
  uint32_t status = 0;
  uint64_t req_id = 0;
  uint64_t addr = 0;
  uint64_t size = 0;
  uint64_t aux = 0;
  uint32_t key = 0;
  uint32_t meta_len = 0;
  uint64_t payload_len = 0;
  uint64_t total = 0;

  void encode(uint8_t* out) const;
  // Throws Error(kProtocol) on a bad magic, version, type or metadata size.
  static FrameHeader decode(const uint8_t* in);
};

}  // namespace rdmaxfer
