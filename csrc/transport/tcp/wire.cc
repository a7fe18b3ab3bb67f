#include "transport/tcp/wire.h"

#include "common/bytes.h"
#include "common/error.h"

namespace rdmaxfer {

namespace {
constexpr uint16_t kFrameMagic = 0x5852;
}

FrameType frame_type_of(CtrlType type) {
  switch (type) {
    case CtrlType::kRts: return FrameType::kMsgRts;
    case CtrlType::kEager: return FrameType::kMsgEager;
    case CtrlType::kCts: return FrameType::kMsgCts;
    case CtrlType::kReject: return FrameType::kMsgReject;
    case CtrlType::kNotify: return FrameType::kMsgNotify;
    case CtrlType::kAbort: return FrameType::kMsgAbort;
  }
  return FrameType::kMsgReject;
}

CtrlType ctrl_type_of(FrameType type) {
  switch (type) {
    case FrameType::kMsgRts: return CtrlType::kRts;
    case FrameType::kMsgEager: return CtrlType::kEager;
    case FrameType::kMsgCts: return CtrlType::kCts;
    case FrameType::kMsgNotify: return CtrlType::kNotify;
    case FrameType::kMsgAbort: return CtrlType::kAbort;
    default: return CtrlType::kReject;
  }
}

const char* frame_type_name(FrameType type) {
  switch (type) {
    case FrameType::kWrite: return "WRITE";
    case FrameType::kWriteAck: return "WRITE_ACK";
    case FrameType::kReadReq: return "READ_REQ";
    case FrameType::kReadResp: return "READ_RESP";
    case FrameType::kMsgRts: return "MSG_RTS";
    case FrameType::kMsgEager: return "MSG_EAGER";
    case FrameType::kMsgCts: return "MSG_CTS";
    case FrameType::kMsgReject: return "MSG_REJECT";
    case FrameType::kMsgData: return "MSG_DATA";
    case FrameType::kGoodbye: return "GOODBYE";
    case FrameType::kMsgNotify: return "MSG_NOTIFY";
    case FrameType::kWriteGather: return "WRITE_GATHER";
    case FrameType::kWriteGatherAck: return "WRITE_GATHER_ACK";
    case FrameType::kReadGather: return "READ_GATHER";
    case FrameType::kReadGatherResp: return "READ_GATHER_RESP";
    case FrameType::kMsgAbort: return "MSG_ABORT";
  }
  return "unknown";
}

void FrameHeader::encode(uint8_t* out) const {
  store_le<uint16_t>(out, kFrameMagic);
  out[2] = kVersion;
  out[3] = static_cast<uint8_t>(type);
  store_le<uint32_t>(out + 4, status);
  store_le<uint64_t>(out + 8, req_id);
  store_le<uint64_t>(out + 16, addr);
  store_le<uint64_t>(out + 24, size);
  store_le<uint64_t>(out + 32, aux);
  store_le<uint32_t>(out + 40, key);
  store_le<uint32_t>(out + 44, meta_len);
  store_le<uint64_t>(out + 48, payload_len);
  store_le<uint64_t>(out + 56, total);
}

FrameHeader FrameHeader::decode(const uint8_t* in) {
  if (load_le<uint16_t>(in) != kFrameMagic) {
    throw Error(ErrorKind::kProtocol, "bad frame magic: the stream is corrupt or not rdmaxfer");
  }
  if (in[2] != kVersion) {
    throw Error(ErrorKind::kProtocol, "unsupported frame version " + std::to_string(in[2]));
  }
  FrameHeader h;
  if (in[3] < static_cast<uint8_t>(FrameType::kWrite) ||
      in[3] > static_cast<uint8_t>(FrameType::kReadGatherResp)) {
    throw Error(ErrorKind::kProtocol, "unknown frame type " + std::to_string(in[3]));
  }
  h.type = static_cast<FrameType>(in[3]);
  h.status = load_le<uint32_t>(in + 4);
  h.req_id = load_le<uint64_t>(in + 8);
  h.addr = load_le<uint64_t>(in + 16);
  h.size = load_le<uint64_t>(in + 24);
  h.aux = load_le<uint64_t>(in + 32);
  h.key = load_le<uint32_t>(in + 40);
  h.meta_len = load_le<uint32_t>(in + 44);
  h.payload_len = load_le<uint64_t>(in + 48);
  h.total = load_le<uint64_t>(in + 56);
  if (h.meta_len > kMaxMeta) {
    throw Error(ErrorKind::kProtocol, "frame metadata of " + std::to_string(h.meta_len) +
                                          " bytes exceeds the limit of " +
                                          std::to_string(kMaxMeta));
  }
  return h;
}

}  // namespace rdmaxfer
