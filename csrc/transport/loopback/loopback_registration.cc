// The loopback transport's one line in the registry (transport/registry.h): unlisted, for tests.
#include "transport/loopback/loopback_transport.h"
#include "transport/registry.h"

namespace rdmaxfer {

namespace {
const TransportRegistration kLoopbackRegistration{TransportEntry{
    LoopbackTransport::declared(), nullptr,
    [](uint64_t engine_id, const TransportConfig&) {
      return std::make_unique<LoopbackTransport>(engine_id);
    },
    nullptr, nullptr}};
}  // namespace

}  // namespace rdmaxfer
