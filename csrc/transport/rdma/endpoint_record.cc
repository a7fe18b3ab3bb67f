#include "transport/rdma/endpoint_record.h"

#include <algorithm>
#include <cstring>

#include "common/le_codec.h"
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
  const Rail& r0 = rails.at(0);
  LeWriter w(reinterpret_cast<uint8_t*>(out.data()), out.size());
  w.bytes(kPeerRecordMagic, 4)
      .put<uint16_t>(kVersion)
      .put<uint8_t>(r0.link_layer)
      .put<uint8_t>(static_cast<uint8_t>(qps.size()))
      .put<uint16_t>(r0.lid)
      .put<uint8_t>(r0.active_mtu)
      .put<uint8_t>(r0.port)
      .put<uint8_t>(r0.gid_index)
      .put<uint8_t>(static_cast<uint8_t>(n_rails - 1))
      .put<uint8_t>(r0.prefix_len)
      .skip(1)
      .bytes(r0.gid, 16)
      .put<uint32_t>(max_message)
      .put<uint32_t>(ctrl_size)
      .put<uint32_t>(ctrl_depth)
      .put<uint8_t>(responder_resources)
      .put<uint8_t>(initiator_depth)
      .put<uint16_t>(r0.generation)
      .put<uint64_t>(engine_id)
      .put<uint32_t>(r0.speed_mbps)
      .skip(4);
  for (const Qp& qp : qps) {
    w.put<uint32_t>(qp.qpn | static_cast<uint32_t>(qp.rail) << 24)
        .put<uint32_t>(qp.psn | static_cast<uint32_t>(qp.peer_rail) << 24);
  }
  for (size_t i = 1; i < rails.size(); ++i) {
    const Rail& r = rails[i];
    w.put<uint8_t>(r.link_layer)
        .put<uint8_t>(r.active_mtu)
        .put<uint8_t>(r.port)
        .put<uint8_t>(r.gid_index)
        .put<uint16_t>(r.lid)
        .put<uint8_t>(r.prefix_len)
        .skip(1)
        .put<uint32_t>(r.speed_mbps)
        .put<uint16_t>(r.generation)
        .skip(2)
        .bytes(r.gid, 16);
  }
  return out;
}

size_t EndpointRecord::peek_size(const uint8_t* in) {
  LeReader r(in, kHeaderSize);
  if (!r.matches(kPeerRecordMagic, 4)) bad("bad magic (not an rdmaxfer verbs peer)");
  const uint16_t version = r.get<uint16_t>();
  if (version != kVersion) {
    bad("unsupported version " + std::to_string(version) + " (this build speaks version " +
        std::to_string(kVersion) + "; use the same rdmaxfer release on both peers)");
  }
  const int n = r.skip(1).get<uint8_t>();  // 0: an acceptor none of whose rails reaches ours
  if (n > kMaxQps) {
    bad("QP count " + std::to_string(n) + " outside 0.." + std::to_string(kMaxQps));
  }
  const int rails = r.skip(5).get<uint8_t>() + 1;
  if (rails > kMaxRails) {
    bad("rail count " + std::to_string(rails) + " outside 1.." + std::to_string(kMaxRails));
  }
  return size_for(n, rails);
}

EndpointRecord EndpointRecord::unpack(const uint8_t* in, size_t size) {
  if (size < kHeaderSize) bad("only " + std::to_string(size) + " bytes");
  if (size != peek_size(in)) bad("size " + std::to_string(size) + " does not match its counts");
  LeReader p(in, size);
  p.skip(6);  // magic and version: peek_size checked them
  EndpointRecord r;
  Rail r0;
  r0.link_layer = p.get<uint8_t>();
  const int n = p.get<uint8_t>();
  r0.lid = p.get<uint16_t>();
  r0.active_mtu = p.get<uint8_t>();
  r0.port = p.get<uint8_t>();
  r0.gid_index = p.get<uint8_t>();
  const int n_rails = p.get<uint8_t>() + 1;
  r0.prefix_len = p.get<uint8_t>();
  if (!p.zeros(1)) bad("reserved bytes are not zero");
  p.copy(r0.gid, 16);
  r.max_message = p.get<uint32_t>();
  r.ctrl_size = p.get<uint32_t>();
  r.ctrl_depth = p.get<uint32_t>();
  r.responder_resources = p.get<uint8_t>();
  r.initiator_depth = p.get<uint8_t>();
  r0.generation = p.get<uint16_t>();
  r.engine_id = p.get<uint64_t>();
  r0.speed_mbps = p.get<uint32_t>();
  if (!p.zeros(4)) bad("reserved bytes are not zero");
  r.rails.push_back(r0);
  for (int i = 0; i < n; ++i) {
    Qp qp;
    const uint32_t a = p.get<uint32_t>();
    const uint32_t b = p.get<uint32_t>();
    qp.qpn = a & 0xffffff;
    qp.rail = static_cast<uint8_t>(a >> 24);
    qp.psn = b & 0xffffff;
    qp.peer_rail = static_cast<uint8_t>(b >> 24);
    if (qp.qpn == 0) bad("QP number 0");
    if (qp.rail >= n_rails) bad("QP on rail " + std::to_string(qp.rail) + " of " +
                                std::to_string(n_rails));
    r.qps.push_back(qp);
  }
  for (int i = 1; i < n_rails; ++i) {
    Rail x;
    x.link_layer = p.get<uint8_t>();
    x.active_mtu = p.get<uint8_t>();
    x.port = p.get<uint8_t>();
    x.gid_index = p.get<uint8_t>();
    x.lid = p.get<uint16_t>();
    x.prefix_len = p.get<uint8_t>();
    if (!p.zeros(1)) bad("reserved bytes are not zero");
    x.speed_mbps = p.get<uint32_t>();
    x.generation = p.get<uint16_t>();
    if (!p.zeros(2)) bad("reserved bytes are not zero");
    p.copy(x.gid, 16);
    r.rails.push_back(x);
  }
  for (size_t i = 0; i < r.rails.size(); ++i) check_rail(r.rails[i], i);
  return r;
}

}  // namespace rdmaxfer
