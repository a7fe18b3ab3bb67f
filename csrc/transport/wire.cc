#include "transport/wire.h"

#include "common/le_codec.h"
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
  LeWriter(out, kSize)
      .put<uint16_t>(kFrameMagic)
      .put<uint8_t>(kVersion)
      .put<uint8_t>(static_cast<uint8_t>(type))
      .put<uint32_t>(status)
      .put<uint64_t>(req_id)
      .put<uint64_t>(addr)
      .put<uint64_t>(size)
      .put<uint64_t>(aux)
      .put<uint32_t>(key)
      .put<uint32_t>(meta_len)
      .put<uint64_t>(payload_len)
      .put<uint64_t>(total);
}

FrameHeader FrameHeader::decode(const uint8_t* in) {
  LeReader r(in, kSize);
  if (r.get<uint16_t>() != kFrameMagic) {
    throw Error(ErrorKind::kProtocol, "bad frame magic: the stream is corrupt or not rdmaxfer");
  }
  const uint8_t version = r.get<uint8_t>();
  if (version != kVersion) {
    throw Error(ErrorKind::kProtocol, "unsupported frame version " + std::to_string(version));
  }
  FrameHeader h;
  const uint8_t type = r.get<uint8_t>();
  if (type < static_cast<uint8_t>(FrameType::kWrite) ||
      type > static_cast<uint8_t>(FrameType::kReadGatherResp)) {
    throw Error(ErrorKind::kProtocol, "unknown frame type " + std::to_string(type));
  }
  h.type = static_cast<FrameType>(type);
  h.status = r.get<uint32_t>();
  h.req_id = r.get<uint64_t>();
  h.addr = r.get<uint64_t>();
  h.size = r.get<uint64_t>();
  h.aux = r.get<uint64_t>();
  h.key = r.get<uint32_t>();
  h.meta_len = r.get<uint32_t>();
  h.payload_len = r.get<uint64_t>();
  h.total = r.get<uint64_t>();
  if (h.meta_len > kMaxMeta) {
    throw Error(ErrorKind::kProtocol, "frame metadata of " + std::to_string(h.meta_len) +
                                          " bytes exceeds the limit of " +
                                          std::to_string(kMaxMeta));
  }
  return h;
}

}  // namespace rdmaxfer
