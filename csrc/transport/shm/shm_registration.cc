// The shm transport's one line in the registry (transport/registry.h): forced, or the
// same-host companion of an automatic engine's network transport.
#include "transport/registry.h"
#include "transport/shm/same_host.h"
#include "transport/shm/shm_transport.h"

namespace rdmaxfer {

namespace {
const TransportRegistration kShmRegistration{TransportEntry{
    ShmTransport::declared(), &shm_unavailable_reason,
    [](uint64_t engine_id, const TransportConfig& c) {
      return std::make_unique<ShmTransport>(engine_id, c);
    },
    [](Transport& owner, const TransportConfig& c) {
      return std::make_unique<ShmTransport>(owner, c);
    },
    nullptr}};
}  // namespace

}  // namespace rdmaxfer
