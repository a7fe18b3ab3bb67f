// The fabric settings of a verbs engine's QPs: the service level and the traffic class that
// put RoCE traffic on a (lossless) class, and the receiver-not-ready timer.
//
// Each comes from the engine's argument, else its environment variable, else the default:
//   service_level  RDMAXFER_SERVICE_LEVEL  0..15   default 0   ah_attr.sl (InfiniBand SL; on
//                                                               RoCE the VLAN priority/PCP)
//   traffic_class  RDMAXFER_TRAFFIC_CLASS  0..255  default 0   ah_attr.grh.traffic_class (RoCE:
//                                                               the IP TOS byte, DSCP << 2 |
//                                                               ECN; e.g. DSCP 26 -> 104)
//   min_rnr_timer  RDMAXFER_MIN_RNR_TIMER  0..31   default 18  the IB RNR timer code (18 =
//                                                               5.12 ms; 0 = 655.36 ms; table
//                                                               in the IB spec, 9.7.5.2.8)
// The GID index (RDMAXFER_GID_INDEX) is resolved with the device (verbs_context.h).
#pragma once

#include <cstdint>
#include <string>

#include "transport/rdma/rdma_config.h"

namespace rdmaxfer {

struct FabricSettings {
  uint8_t service_level = 0;
  uint8_t traffic_class = 0;
  uint8_t min_rnr_timer = 18;
};

// Throws Error(kInvalidArgument) naming the argument or variable, the value and the range.
FabricSettings resolve_fabric_settings(const RdmaConfig& config);

// "SL 3, traffic class 104 (DSCP 26), min RNR timer 18 (5.12 ms)".
std::string describe_fabric_settings(const FabricSettings& settings);

}  // namespace rdmaxfer
