// The control messages of the two-sided protocol (protocol/message_protocol.h), as every
// transport carries them (verbs: a SEND into the peer's control receive buffers, control_msg.h;
// TCP: a frame, wire.h):
//   RTS     msg_id, size, meta: a message waits at the sender (rendezvous)
//   EAGER   like RTS with the data attached (size <= the channel's eager limit)
//   CTS     msg_id; for rendezvous addr + key (+ route) of the receiver's grant, which the
//           sender WRITEs with notification (value = low 32 bits of msg_id). For EAGER the CTS only
//           acknowledges.
//   REJECT  msg_id, meta = reason: the receiver refused the message.
//   NOTIFY  msg_id (the sender's request id); size 1: an int payload in key (32 bits, an
//           IMM's room), size 0: a bytes payload in meta (at most 64 bytes). Sent once every
//           byte of the request it follows was placed at the peer (protocol/batch.h).
//   ABORT   msg_id, meta = the reason: the sender gave up on a message the receiver granted
//           (its WRITE failed while the channel stayed open: on verbs, a rail failed under
//           it); the receiver fails that RECV at once instead of at its timeout.
#pragma once

#include <cstdint>
#include <string>

#include "core/region.h"

namespace rdmaxfer {

enum class CtrlType : uint8_t {
  kRts = 1,
  kEager = 2,
  kCts = 3,
  kReject = 4,
  kNotify = 5,
  kAbort = 6
};
const char* ctrl_type_name(CtrlType type);

struct CtrlMessage {
  CtrlType type = CtrlType::kRts;
  uint64_t msg_id = 0;  // the sender's request id
  uint64_t size = 0;    // message bytes
  uint64_t addr = 0;    // CTS of a rendezvous: where to write
  uint32_t key = 0;     // CTS of a rendezvous: the grant's key (the rkey on verbs)
  uint32_t route = 0;   // CTS of a rendezvous: the grant's route (Grant)
  std::string meta;     // RTS/EAGER: the sender's metadata; REJECT: the reason
  std::string data;     // a received EAGER message's bytes
};

// An outgoing EAGER message's bytes, in registered memory kept in use until sent or copied.
struct CtrlPayload {
  const uint8_t* data = nullptr;
  uint64_t length = 0;
  RegionUse hold;
};

// A buffer the receiver lets the peer write for one message (rendezvous).
struct Grant {
  uint64_t id = 0;    // the channel's handle, for release_grant
  uint64_t addr = 0;  // where the peer writes
  uint32_t key = 0;   // what the peer names it by (the rkey on verbs)
  // Where `key` is valid, for the peer's post_write_notify: on verbs the granting side's rail
  // (its index in that side's endpoint record), whose PD holds the rkey; 0 elsewhere.
  uint32_t route = 0;
};

}  // namespace rdmaxfer
