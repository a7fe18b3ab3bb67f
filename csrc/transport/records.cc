#include "transport/records.h"

#include "common/error.h"
#include "core/descriptor.h"
#include "transport/bootstrap.h"
#include "transport/rdma/control_msg.h"
#include "transport/rdma/endpoint_record.h"
#include "transport/tcp/wire.h"

namespace rdmaxfer {

namespace {
void need(size_t size, size_t want, const char* what) {
  if (size != want) {
    throw Error(ErrorKind::kProtocol, std::string(what) + ": expected " + std::to_string(want) +
                                          " bytes, got " + std::to_string(size));
  }
}
}  // namespace

std::vector<std::string> record_kinds() {
  return {"descriptor", "hello", "hello_ack", "frame", "endpoint_record", "control"};
}

std::string parse_record(const std::string& kind, const uint8_t* data, size_t size) {
  if (kind == "descriptor") {
    Descriptor d = Descriptor::unpack(data, size);
    return "descriptor length=" + std::to_string(d.length) + " key=" + std::to_string(d.key);
  }
  if (kind == "hello") {
    need(size, Hello::kSize, "hello");
    Hello h = Hello::unpack(data);
    return "hello stream " + std::to_string(h.stream_index) + "/" + std::to_string(h.n_streams);
  }
  if (kind == "hello_ack") {
    need(size, HelloAck::kSize, "hello_ack");
    HelloAck a = HelloAck::unpack(data);
    return "hello_ack status " + std::to_string(static_cast<int>(a.status));
  }
  if (kind == "frame") {
    need(size, FrameHeader::kSize, "frame");
    FrameHeader f = FrameHeader::decode(data);
    return std::string("frame ") + frame_type_name(f.type);
  }
  if (kind == "endpoint_record") {
    EndpointRecord r = EndpointRecord::unpack(data, size);
    return "endpoint_record qps=" + std::to_string(r.qps.size());
  }
  if (kind == "control") {
    CtrlHeader c = CtrlHeader::decode(data, size);
    return std::string("control ") + ctrl_type_name(c.type);
  }
  throw Error(ErrorKind::kInvalidArgument, "unknown record kind '" + kind + "'");
}

}  // namespace rdmaxfer
