#include "transport/registry.h"

#include "common/error.h"
#include "transport/tcp/tcp_transport.h"
#ifdef RDMAXFER_HAVE_VERBS
#include "transport/rdma/rdma_transport.h"
#endif

namespace rdmaxfer {

std::map<std::string, std::string> available_transports() {
#ifdef RDMAXFER_HAVE_VERBS
  std::string rdma = rdma_unavailable_reason();
#else
  std::string rdma =
      "rdmaxfer was built without verbs headers (install libibverbs-dev / rdma-core-devel and "
      "rebuild)";
#endif
  return {
      {"tcp", ""},
      {"rdma", rdma},
  };
}

std::unique_ptr<Transport> make_transport(const std::string& name, uint64_t engine_id,
                                          const TransportConfig& config) {
  if (name == "tcp") return std::make_unique<TcpTransport>(engine_id, config.tcp);
#ifdef RDMAXFER_HAVE_VERBS
  if (name == "rdma") return std::make_unique<RdmaTransport>(engine_id, config.rdma);
#endif
  auto available = available_transports();
  auto it = available.find(name);
  if (it == available.end()) {
    throw Error(ErrorKind::kInvalidArgument,
                "unknown transport '" + name + "'; choose 'tcp', 'rdma' or 'auto'");
  }
  throw Error(ErrorKind::kUnsupported, "transport '" + name + "' is unavailable: " + it->second);
}

}  // namespace rdmaxfer
