// Picks a transport by name. The only place that names the implementations.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "transport/rdma/rdma_config.h"
#include "transport/tcp/tcp_connection.h"
#include "transport/transport.h"

namespace rdmaxfer {

struct TransportConfig {
  TcpConfig tcp;
  RdmaConfig rdma;
};

// Transport name -> "" when usable on this machine, else why not.
std::map<std::string, std::string> available_transports();

// Throws Error(kUnsupported) with the reason when `name` cannot run here.
std::unique_ptr<Transport> make_transport(const std::string& name, uint64_t engine_id,
                                          const TransportConfig& config);

// The same-host companion of the engine's network transport `owner` (transport="auto",
// engine/wireup.h): the shm transport serving owner's registrations. Throws Error(kUnsupported)
// with the reason when shm cannot run here.
std::unique_ptr<Transport> make_same_host_companion(Transport& owner,
                                                    const TransportConfig& config);

}  // namespace rdmaxfer
