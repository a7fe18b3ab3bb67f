// Settings of the verbs transport (Engine(transport="rdma", ...)). No verbs types here, so the
// registry can name it in builds without the verbs headers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transport/tls.h"

namespace rdmaxfer {

struct RdmaConfig {
  std::vector<std::string> devices;  // the rails (rdma_rails.h); {} -> `device`
  std::string device;       // "" -> env RDMAXFER_RDMA_DEVICES -> env RDMAXFER_RDMA_DEVICE ->
                            // first device with an active port
  int port = 0;             // 0 -> the device's first active port
  int gid_index = -1;       // -1 -> env RDMAXFER_GID_INDEX -> auto (see verbs_context.h)
  std::string poll_mode;    // core/poll_mode.h: "adaptive" (default; env RDMAXFER_POLL_MODE;
                            // as "event" on verbs), "event" or "busy"
  int default_qps = 0;      // QPs per connection; 0 -> 1
  uint64_t eager_limit = 0; // bytes sent inside the SEND with the header; 0 -> 8 KiB
  int sq_depth = 0;         // send-queue WRs per QP; 0 -> min(device max_qp_wr, 256)
  std::string secret;       // shared secret for the bootstrap (transport/auth.h); "" = none
  bool tls = false;         // TLS 1.3 on the bootstrap stream (transport/tls.h)
  TlsSettings tls_settings;
  // Fabric settings (fabric_settings.h): -1 -> the environment variable -> the default.
  int service_level = -1;   // SL 0..15; env RDMAXFER_SERVICE_LEVEL; default 0
  int traffic_class = -1;   // GRH traffic class 0..255 (DSCP << 2); env RDMAXFER_TRAFFIC_CLASS; 0
  int min_rnr_timer = -1;   // IB RNR timer code 0..31; env RDMAXFER_MIN_RNR_TIMER; 18 (5.12 ms)
};

// "" when the verbs transport can run here (libibverbs loads and a device has an active port),
// else why not. Cheap enough to call from available_transports().
std::string rdma_unavailable_reason();

}  // namespace rdmaxfer
