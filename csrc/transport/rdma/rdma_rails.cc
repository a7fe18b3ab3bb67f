#include "transport/rdma/rdma_rails.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/error.h"
#include "common/name_list.h"

namespace rdmaxfer {

namespace {
int prefix_bits(uint32_t mask_host_order) {
  int n = 0;
  while (n < 32 && (mask_host_order & (0x80000000u >> n)) != 0) ++n;
  return n;
}
}  // namespace

std::vector<std::string> rail_devices(const RdmaConfig& config) {
  std::vector<std::string> names = config.devices;
  std::string source = "rdma_devices";
  if (names.empty() && !config.device.empty()) {
    names = {config.device};
    source = "rdma_device";
  }
  if (names.empty()) {
    const char* env = std::getenv("RDMAXFER_RDMA_DEVICES");
    if (env != nullptr) names = split_names(env);
    source = "RDMAXFER_RDMA_DEVICES";
  }
  if (names.size() == 1 && names[0] == "auto") {
    names = DeviceContext::active_devices();
    if (names.empty()) {
      throw Error(ErrorKind::kUnsupported,
                  source + "='auto': no RDMA device has an active port (ibv_devinfo lists them)");
    }
  }
  if (names.empty()) return {""};
  if (names.size() > static_cast<size_t>(EndpointRecord::kMaxRails)) {
    throw Error(ErrorKind::kInvalidArgument,
                source + " names " + std::to_string(names.size()) + " devices; at most " +
                    std::to_string(EndpointRecord::kMaxRails) + " rails per engine");
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == "auto" || names[i].empty()) {
      throw Error(ErrorKind::kInvalidArgument,
                  source + ": '" + names[i] + "' is not a device name; give names "
                  "(\"mlx5_0\", \"rxe0\") or \"auto\" alone");
    }
    if (std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i), names[i]) !=
        names.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw Error(ErrorKind::kInvalidArgument,
                  source + " names " + names[i] + " twice; give each device once");
    }
  }
  return names;
}

uint32_t link_speed_mbps(uint8_t active_speed, uint8_t active_width) {
  uint32_t lane = 0;  // Mb/s per lane (IBTA active_speed codes)
  switch (active_speed) {
    case 1: lane = 2500; break;
    case 2: lane = 5000; break;
    case 4:
    case 8: lane = 10000; break;
    case 16: lane = 14000; break;
    case 32: lane = 25000; break;
    case 64: lane = 50000; break;
    case 128: lane = 100000; break;
    default: return 0;
  }
  uint32_t width = 0;
  switch (active_width) {
    case 1: width = 1; break;
    case 2: width = 4; break;
    case 4: width = 8; break;
    case 8: width = 12; break;
    case 16: width = 2; break;
    default: return 0;
  }
  return lane * width;
}

EndpointRecord::Rail rail_record(const DeviceContext& dc) {
  EndpointRecord::Rail r;
  r.link_layer = dc.ethernet() ? EndpointRecord::kLinkEthernet : EndpointRecord::kLinkInfiniBand;
  r.lid = dc.port_attr().lid;
  r.active_mtu = static_cast<uint8_t>(dc.port_attr().active_mtu);
  r.port = dc.port();
  r.gid_index = static_cast<uint8_t>(dc.gid_index());
  std::memcpy(r.gid, dc.gid().raw, 16);
  r.speed_mbps = link_speed_mbps(dc.port_attr().active_speed, dc.port_attr().active_width);
  const uint8_t* g = r.gid;
  if (!dc.ethernet() || !gid_is_ipv4(g)) return r;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return r;  // unknown prefix: rails_reach assumes reachable
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_netmask == nullptr || a->ifa_addr->sa_family != AF_INET) {
      continue;
    }
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (std::memcmp(&in->sin_addr.s_addr, g + 12, 4) != 0) continue;
    const auto* mask = reinterpret_cast<const sockaddr_in*>(a->ifa_netmask);
    r.prefix_len = static_cast<uint8_t>(prefix_bits(ntohl(mask->sin_addr.s_addr)));
    break;
  }
  freeifaddrs(list);
  return r;
}

std::string rail_text(const std::string& name, const EndpointRecord::Rail& r) {
  std::ostringstream s;
  s << name << " (";
  if (r.link_layer == EndpointRecord::kLinkInfiniBand) {
    s << "InfiniBand LID " << r.lid;
  } else {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (gid_is_ipv4(r.gid)) {
      inet_ntop(AF_INET, r.gid + 12, buf, sizeof(buf));
    } else {
      inet_ntop(AF_INET6, r.gid, buf, sizeof(buf));
    }
    s << buf;
    if (r.prefix_len > 0) s << "/" << static_cast<int>(r.prefix_len);
  }
  if (r.speed_mbps > 0) s << ", " << r.speed_mbps << " Mb/s";
  s << ")";
  return s.str();
}

std::string no_rail_pair(const std::vector<Rail>& ours, const EndpointRecord& peer) {
  std::string mine;
  std::string theirs;
  for (size_t r = 0; r < ours.size(); ++r) {
    mine += (r == 0 ? "" : ", ") + rail_text(ours[r].name, ours[r].record);
  }
  for (size_t c = 0; c < peer.rails.size(); ++c) {
    theirs += (c == 0 ? "" : ", ") + rail_text("rail " + std::to_string(c), peer.rails[c]);
  }
  return "no rail of this engine (" + mine + ") reaches a rail of the peer (" + theirs +
         "): the devices must share a fabric (same link layer and IPv4 network or subnet)";
}

}  // namespace rdmaxfer
