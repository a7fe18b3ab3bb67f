// The ofi transport's one line in the registry (transport/registry.h), and its endpoint record
// for parse_record (records.h).
#include <memory>
#include <string>

#include "transport/ofi/ofi_transport.h"
#include "transport/ofi/ofi_wire.h"
#include "transport/records.h"
#include "transport/registry.h"

namespace rdmaxfer {

namespace {

const TransportRegistration kOfiRegistration{TransportEntry{
    OfiTransport::declared(),
    [] { return ofi_unavailable_reason(OfiConfig::from(TransportConfig{})); },
    [](uint64_t engine_id, const TransportConfig& c) {
      return std::make_unique<OfiTransport>(engine_id, OfiConfig::from(c));
    },
    nullptr, [] { return ofi_auto_unavailable_reason(OfiConfig::from(TransportConfig{})); }}};

const RecordRegistration kOfiEndpointRecord{
    "ofi_endpoint_record", [](const uint8_t* data, size_t size) {
      OfiEndpointRecord r = OfiEndpointRecord::unpack(data, size);
      return "ofi_endpoint_record provider=" + r.provider +
             " rails=" + std::to_string(r.addresses.size()) +
             " address_bytes=" + std::to_string(r.addresses[0].size());
    }};

}  // namespace

}  // namespace rdmaxfer
