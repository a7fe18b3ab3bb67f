// The verbs transport's one line in the registry (transport/registry.h), its settings read
// from the engine's ("rdma.<name>"), and its wire records for parse_record (records.h).
#include "transport/rdma/rdma_registration.h"

#include "common/error.h"
#include "transport/rdma/control_msg.h"
#include "transport/rdma/endpoint_record.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/verbs_api.h"
#include "transport/records.h"
#include "transport/registry.h"

namespace rdmaxfer {

namespace {
std::vector<std::string> rdma_device_names(const std::string& text) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    if (end > start) names.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return names;
}

RdmaConfig rdma_config(const TransportConfig& c) {
  RdmaConfig r;
  r.device = c.setting("rdma", "device", "");
  r.devices = rdma_device_names(c.setting("rdma", "devices", ""));
  r.gid_index = c.int_setting("rdma", "gid_index", -1);
  if (r.gid_index < -1 || r.gid_index > 65535) {
    throw Error(ErrorKind::kInvalidArgument, "gid_index=" + std::to_string(r.gid_index) +
                                                 " must be -1 (auto) or a GID table index");
  }
  r.poll_mode = poll_mode_name(c.poll_mode);
  r.secret = c.secret;
  r.tls = c.tls("rdma", &r.tls_settings);
  r.default_qps = c.default_streams;
  r.service_level = c.int_setting("rdma", "service_level", -1);  // checked by the transport
  r.traffic_class = c.int_setting("rdma", "traffic_class", -1);
  r.min_rnr_timer = c.int_setting("rdma", "min_rnr_timer", -1);
  return r;
}

const TransportRegistration kRdmaRegistration{TransportEntry{
    RdmaTransport::declared(), &rdma_unavailable_reason,
    [](uint64_t engine_id, const TransportConfig& c) {
      return std::make_unique<RdmaTransport>(engine_id, rdma_config(c));
    },
    nullptr, nullptr}};

const RecordRegistration kEndpointRecord{"endpoint_record", [](const uint8_t* data, size_t size) {
  EndpointRecord r = EndpointRecord::unpack(data, size);
  return "endpoint_record qps=" + std::to_string(r.qps.size());
}};

const RecordRegistration kControlRecord{"control", [](const uint8_t* data, size_t size) {
  CtrlHeader c = CtrlHeader::decode(data, size);
  return std::string("control ") + ctrl_type_name(c.type);
}};
}  // namespace

std::string verbs_dmabuf_unavailable() {
  std::string why;
  const VerbsApi* api = verbs_api(&why);
  if (api == nullptr) return why;
  if (api->reg_dmabuf_mr == nullptr) {
    return "libibverbs.so.1 lacks ibv_reg_dmabuf_mr@IBVERBS_1.12 (rdma-core >= 34 has it)";
  }
  return "";
}

}  // namespace rdmaxfer
