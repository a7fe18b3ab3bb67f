#include "transport/registry.h"

#include "common/error.h"
#include "transport/loopback/loopback_transport.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/shm/same_host.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace rdmaxfer {

std::map<std::string, std::string> available_transports() {
  std::string rdma = rdma_unavailable_reason();
  return {
      {"tcp", ""},
      {"rdma", rdma},
      {"shm", shm_unavailable_reason()},
  };
}

std::unique_ptr<Transport> make_transport(const std::string& name, uint64_t engine_id,
                                          const TransportConfig& config) {
  if (name == "tcp") return std::make_unique<TcpTransport>(engine_id, config.tcp);
  if (name == "rdma") return std::make_unique<RdmaTransport>(engine_id, config.rdma);
  if (name == "shm") return std::make_unique<ShmTransport>(engine_id, config.tcp);
  // Internal (not in available_transports): the in-process test transport.
  if (name == "loopback") return std::make_unique<LoopbackTransport>(engine_id);
  auto available = available_transports();
  auto it = available.find(name);
  if (it == available.end()) {
    throw Error(ErrorKind::kInvalidArgument,
                "unknown transport '" + name + "'; choose 'tcp', 'rdma', 'shm' or 'auto'");
  }
  throw Error(ErrorKind::kUnsupported, "transport '" + name + "' is unavailable: " + it->second);
}

std::unique_ptr<Transport> make_same_host_companion(Transport& owner,
                                                    const TransportConfig& config) {
  return std::make_unique<ShmTransport>(owner, config.tcp);
}

}  // namespace rdmaxfer
