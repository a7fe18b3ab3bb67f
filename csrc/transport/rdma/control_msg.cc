#include "transport/rdma/control_msg.h"

#include <cstring>
#include <string>

#include "common/le_codec.h"
#include "common/error.h"

namespace rdmaxfer {

namespace {
constexpr uint16_t kControlMagic = 0x4352;
constexpr uint64_t kSeqMask = (1ull << 48) - 1;
}

CtrlHeader CtrlHeader::of(const CtrlMessage& message, uint64_t payload_len) {
  CtrlHeader h;
  h.type = message.type;
  h.msg_id = message.msg_id;
  h.size = message.size;
  h.addr = message.addr;
  h.rkey = message.key;
  h.grant_rail = static_cast<uint8_t>(message.route);
  h.meta_len = static_cast<uint32_t>(message.meta.size());
  h.payload_len = static_cast<uint32_t>(payload_len);
  return h;
}

CtrlMessage CtrlHeader::message(const uint8_t* body) const {
  CtrlMessage m;
  m.type = type;
  m.msg_id = msg_id;
  m.size = size;
  m.addr = addr;
  m.key = rkey;
  m.route = grant_rail;
  m.meta.assign(reinterpret_cast<const char*>(body), meta_len);
  m.data.assign(reinterpret_cast<const char*>(body + meta_len), payload_len);
  return m;
}

void CtrlHeader::encode(uint8_t* out) const {
  LeWriter(out, kSize)
      .put<uint16_t>(kControlMagic)
      .put<uint8_t>(kVersion)
      .put<uint8_t>(static_cast<uint8_t>(type))
      .put<uint32_t>(meta_len)
      .put<uint64_t>(msg_id)
      .put<uint64_t>(size)
      .put<uint64_t>(addr)
      .put<uint32_t>(rkey)
      .put<uint32_t>(payload_len)
      .put<uint64_t>((seq & kSeqMask) | static_cast<uint64_t>(grant_rail) << 48);
}

CtrlHeader CtrlHeader::decode(const uint8_t* in, size_t available) {
  auto bad = [](const std::string& what) {
    throw Error(ErrorKind::kProtocol, "invalid control message from the peer: " + what);
  };
  if (available < kSize) bad("only " + std::to_string(available) + " bytes");
  LeReader r(in, kSize);
  if (r.get<uint16_t>() != kControlMagic) bad("bad magic");
  const uint8_t version = r.get<uint8_t>();
  if (version != kVersion) bad("unsupported version " + std::to_string(version));
  CtrlHeader h;
  const uint8_t type = r.get<uint8_t>();
  if ((type < 1 || type > static_cast<uint8_t>(CtrlType::kAbort)) &&
      (type < static_cast<uint8_t>(kCtrlRailDown) || type > static_cast<uint8_t>(kCtrlRailBack))) {
    bad("unknown type " + std::to_string(type));
  }
  h.type = static_cast<CtrlType>(type);
  h.meta_len = r.get<uint32_t>();
  h.msg_id = r.get<uint64_t>();
  h.size = r.get<uint64_t>();
  h.addr = r.get<uint64_t>();
  h.rkey = r.get<uint32_t>();
  h.payload_len = r.get<uint32_t>();
  const uint64_t tail = r.get<uint64_t>();
  h.seq = tail & kSeqMask;
  h.grant_rail = static_cast<uint8_t>(tail >> 48);
  if (static_cast<uint64_t>(h.meta_len) + h.payload_len > available - kSize) {
    bad("metadata and data run past the received " + std::to_string(available) + " bytes");
  }
  if (h.type == CtrlType::kEager && h.payload_len != h.size) bad("EAGER data length != size");
  if (h.type != CtrlType::kEager && h.payload_len != 0) bad("unexpected data");
  return h;
}

bool CtrlSeqFilter::first(uint64_t seq) {
  if (seq == 0) return true;
  if (seq < below_ || !above_.insert(seq).second) return false;
  if (above_.size() > kMaxAbove) below_ = *above_.begin();
  advance();
  return true;
}

void CtrlSeqFilter::advance() {
  while (!above_.empty() && *above_.begin() == below_) {
    above_.erase(above_.begin());
    ++below_;
  }
}

}  // namespace rdmaxfer
