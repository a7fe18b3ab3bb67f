#include "transport/rdma/endpoint_record.h"

#include <algorithm>
#include <cstring>

#include "common/bytes.h"
#include "common/error.h"

namespace rdmaxfer {

namespace {
constexpr uint8_t kPeerRecordMagic[4] = {'R', 'X', 'E', 'P'};

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorKind::kProtocol, "invalid RDMA endpoint record from the peer: " + what);
}

void check_rail(const EndpointRecord::Rail& r, size_t index) {
  if (r.link_layer != EndpointRecord::kLinkInfiniBand &&
      r.link_layer != EndpointRecord::kLinkEthernet) {
    bad("rail " + std::to_string(index) + ": unknown link layer " + std::to_string(r.link_layer));
  }
  if (r.active_mtu < 1 || r.active_mtu > 5) {
    bad("rail " + std::to_string(index) + ": MTU code " + std::to_string(r.active_mtu));
  }
  if (r.prefix_len > 32) {
    bad("rail " + std::to_string(index) + ": IPv4 prefix length " + std::to_string(r.prefix_len));
  }
}

uint32_t ipv4_of(const uint8_t* g) {
  return static_cast<uint32_t>(g[12]) << 24 | static_cast<uint32_t>(g[13]) << 16 |
         static_cast<uint32_t>(g[14]) << 8 | g[15];
}
}  // namespace

bool gid_is_ipv4(const uint8_t* g) {
  for (int i = 0; i < 10; ++i) {
    if (g[i] != 0) return false;
  }
  return g[10] == 0xff && g[11] == 0xff;
}

bool rails_reach(const EndpointRecord::Rail& a, const EndpointRecord::Rail& b) {
  if (a.link_layer != b.link_layer) return false;
  if (a.link_layer == EndpointRecord::kLinkInfiniBand) {
    return std::memcmp(a.gid, b.gid, 8) == 0;  // the subnet prefix
  }
  if (!gid_is_ipv4(a.gid) || !gid_is_ipv4(b.gid) || a.prefix_len == 0 || b.prefix_len == 0) {
    return true;  // nothing says otherwise: the fabric may route between them
  }
  const int bits = std::min(a.prefix_len, b.prefix_len);
  const uint32_t mask = bits == 0 ? 0 : ~0u << (32 - bits);
  return (ipv4_of(a.gid) & mask) == (ipv4_of(b.gid) & mask);
}

std::string EndpointRecord::pack() const {
  const int n_rails = static_cast<int>(rails.size());
  std::string out(size_for(static_cast<int>(qps.size()), n_rails), '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  const Rail& r0 = rails.at(0);
  std::memcpy(p, kPeerRecordMagic, 4);
  store_le<uint16_t>(p + 4, kVersion);
  p[6] = r0.link_layer;
  p[7] = static_cast<uint8_t>(qps.size());
  store_le<uint16_t>(p + 8, r0.lid);
  p[10] = r0.active_mtu;
  p[11] = r0.port;
  p[12] = r0.gid_index;
  p[13] = static_cast<uint8_t>(n_rails - 1);
  p[14] = r0.prefix_len;
  std::memcpy(p + 16, r0.gid, 16);
  store_le<uint32_t>(p + 32, max_message);
  store_le<uint32_t>(p + 36, ctrl_size);
  store_le<uint32_t>(p + 40, ctrl_depth);
  p[44] = responder_resources;
  p[45] = initiator_depth;
  store_le<uint64_t>(p + 48, engine_id);
  store_le<uint32_t>(p + 56, r0.speed_mbps);
  uint8_t* q = p + kHeaderSize;
  for (const Qp& qp : qps) {
    store_le<uint32_t>(q, qp.qpn | static_cast<uint32_t>(qp.rail) << 24);
    store_le<uint32_t>(q + 4, qp.psn | static_cast<uint32_t>(qp.peer_rail) << 24);
    q += 8;
  }
  for (size_t i = 1; i < rails.size(); ++i, q += kRailSize) {
    const Rail& r = rails[i];
    q[0] = r.link_layer;
    q[1] = r.active_mtu;
    q[2] = r.port;
    q[3] = r.gid_index;
    store_le<uint16_t>(q + 4, r.lid);
    q[6] = r.prefix_len;
    store_le<uint32_t>(q + 8, r.speed_mbps);
    std::memcpy(q + 16, r.gid, 16);
  }
  return out;
}

size_t EndpointRecord::peek_size(const uint8_t* in) {
  if (std::memcmp(in, kPeerRecordMagic, 4) != 0) bad("bad magic (not an rdmaxfer verbs peer)");
  const uint16_t version = load_le<uint16_t>(in + 4);
  if (version != kVersion) {
    bad("unsupported version " + std::to_string(version) + " (this build speaks version " +
        std::to_string(kVersion) + "; use the same rdmaxfer release on both peers)");
  }
  const int n = in[7];  // 0: an acceptor none of whose rails reaches the connector's
  if (n > kMaxQps) {
    bad("QP count " + std::to_string(n) + " outside 0.." + std::to_string(kMaxQps));
  }
  const int rails = in[13] + 1;
  if (rails > kMaxRails) {
    bad("rail count " + std::to_string(rails) + " outside 1.." + std::to_string(kMaxRails));
  }
  return size_for(n, rails);
}

EndpointRecord EndpointRecord::unpack(const uint8_t* in, size_t size) {
  if (size < kHeaderSize) bad("only " + std::to_string(size) + " bytes");
  if (size != peek_size(in)) bad("size " + std::to_string(size) + " does not match its counts");
  const int n = in[7];
  const int n_rails = in[13] + 1;
  EndpointRecord r;
  Rail r0;
  r0.link_layer = in[6];
  r0.lid = load_le<uint16_t>(in + 8);
  r0.active_mtu = in[10];
  r0.port = in[11];
  r0.gid_index = in[12];
  r0.prefix_len = in[14];
  for (int i : {15, 46, 47}) {
    if (in[i] != 0) bad("reserved bytes are not zero");
  }
  if (load_le<uint32_t>(in + 60) != 0) bad("reserved bytes are not zero");
  std::memcpy(r0.gid, in + 16, 16);
  r0.speed_mbps = load_le<uint32_t>(in + 56);
  r.rails.push_back(r0);
  r.max_message = load_le<uint32_t>(in + 32);
  r.ctrl_size = load_le<uint32_t>(in + 36);
  r.ctrl_depth = load_le<uint32_t>(in + 40);
  r.responder_resources = in[44];
  r.initiator_depth = in[45];
  r.engine_id = load_le<uint64_t>(in + 48);
  const uint8_t* q = in + kHeaderSize;
  for (int i = 0; i < n; ++i, q += 8) {
    Qp qp;
    const uint32_t a = load_le<uint32_t>(q);
    const uint32_t b = load_le<uint32_t>(q + 4);
    qp.qpn = a & 0xffffff;
    qp.rail = static_cast<uint8_t>(a >> 24);
    qp.psn = b & 0xffffff;
    qp.peer_rail = static_cast<uint8_t>(b >> 24);
    if (qp.qpn == 0) bad("QP number 0");
    if (qp.rail >= n_rails) bad("QP on rail " + std::to_string(qp.rail) + " of " +
                                std::to_string(n_rails));
    r.qps.push_back(qp);
  }
  for (int i = 1; i < n_rails; ++i, q += kRailSize) {
    Rail x;
    x.link_layer = q[0];
    x.active_mtu = q[1];
    x.port = q[2];
    x.gid_index = q[3];
    x.lid = load_le<uint16_t>(q + 4);
    x.prefix_len = q[6];
    if (q[7] != 0 || load_le<uint32_t>(q + 12) != 0) bad("reserved bytes are not zero");
    x.speed_mbps = load_le<uint32_t>(q + 8);
    std::memcpy(x.gid, q + 16, 16);
    r.rails.push_back(x);
  }
  for (size_t i = 0; i < r.rails.size(); ++i) check_rail(r.rails[i], i);
  return r;
}

}  // namespace rdmaxfer
