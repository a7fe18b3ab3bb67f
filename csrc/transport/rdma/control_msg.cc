#include "transport/rdma/control_msg.h"

#include <cstring>
#include <string>

#include "common/bytes.h"
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
  std::memset(out, 0, kSize);
  store_le<uint16_t>(out, kControlMagic);
  out[2] = kVersion;
  out[3] = static_cast<uint8_t>(type);
  store_le<uint32_t>(out + 4, meta_len);
  store_le<uint64_t>(out + 8, msg_id);
  store_le<uint64_t>(out + 16, size);
  store_le<uint64_t>(out + 24, addr);
  store_le<uint32_t>(out + 32, rkey);
  store_le<uint32_t>(out + 36, payload_len);
  store_le<uint64_t>(out + 40, (seq & kSeqMask) | static_cast<uint64_t>(grant_rail) << 48);
}

CtrlHeader CtrlHeader::decode(const uint8_t* in, size_t available) {
  auto bad = [](const std::string& what) {
    throw Error(ErrorKind::kProtocol, "invalid control message from the peer: " + what);
  };
  if (available < kSize) bad("only " + std::to_string(available) + " bytes");
  if (load_le<uint16_t>(in) != kControlMagic) bad("bad magic");
  if (in[2] != kVersion) bad("unsupported version " + std::to_string(in[2]));
  CtrlHeader h;
  if ((in[3] < 1 || in[3] > static_cast<uint8_t>(CtrlType::kAbort)) &&
      in[3] != static_cast<uint8_t>(kCtrlRailDown)) {
    bad("unknown type " + std::to_string(in[3]));
  }
  h.type = static_cast<CtrlType>(in[3]);
  h.meta_len = load_le<uint32_t>(in + 4);
  h.msg_id = load_le<uint64_t>(in + 8);
  h.size = load_le<uint64_t>(in + 16);
  h.addr = load_le<uint64_t>(in + 24);
  h.rkey = load_le<uint32_t>(in + 32);
  h.payload_len = load_le<uint32_t>(in + 36);
  const uint64_t tail = load_le<uint64_t>(in + 40);
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
