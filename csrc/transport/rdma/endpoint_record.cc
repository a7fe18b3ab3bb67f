#include "transport/rdma/endpoint_record.h"

#include <cstring>

#include "common/bytes.h"
#include "common/error.h"

namespace rdmaxfer {

namespace {
constexpr uint8_t kMagic[4] = {'R', 'X', 'E', 'P'};

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorKind::kProtocol, "invalid RDMA endpoint record from the peer: " + what);
}
}  // namespace

std::string EndpointRecord::pack() const {
  std::string out(size_for(static_cast<int>(qps.size())), '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(p, kMagic, 4);
  store_le<uint16_t>(p + 4, kVersion);
  p[6] = link_layer;
  p[7] = static_cast<uint8_t>(qps.size());
  store_le<uint16_t>(p + 8, lid);
  p[10] = active_mtu;
  p[11] = port;
  p[12] = gid_index;
  std::memcpy(p + 16, gid, 16);
  store_le<uint32_t>(p + 32, max_message);
  store_le<uint32_t>(p + 36, ctrl_size);
  store_le<uint32_t>(p + 40, ctrl_depth);
  p[44] = responder_resources;
  p[45] = initiator_depth;
  store_le<uint64_t>(p + 48, engine_id);
  for (size_t i = 0; i < qps.size(); ++i) {
    store_le<uint32_t>(p + kHeaderSize + 8 * i, qps[i].qpn);
    store_le<uint32_t>(p + kHeaderSize + 8 * i + 4, qps[i].psn);
  }
  return out;
}

int EndpointRecord::peek_qps(const uint8_t* in) {
  if (std::memcmp(in, kMagic, 4) != 0) bad("bad magic (not an rdmaxfer verbs peer)");
  const uint16_t version = load_le<uint16_t>(in + 4);
  if (version != kVersion) {
    bad("unsupported version " + std::to_string(version) + " (this build speaks version " +
        std::to_string(kVersion) + "; use the same rdmaxfer release on both peers)");
  }
  const int n = in[7];
  if (n < 1 || n > kMaxQps) {
    bad("QP count " + std::to_string(n) + " outside 1.." + std::to_string(kMaxQps));
  }
  return n;
}

EndpointRecord EndpointRecord::unpack(const uint8_t* in, size_t size) {
  if (size < kHeaderSize) bad("only " + std::to_string(size) + " bytes");
  const int n = peek_qps(in);
  if (size != size_for(n)) bad("size " + std::to_string(size) + " does not match its QP count");
  EndpointRecord r;
  r.link_layer = in[6];
  if (r.link_layer != kLinkInfiniBand && r.link_layer != kLinkEthernet) {
    bad("unknown link layer " + std::to_string(r.link_layer));
  }
  r.lid = load_le<uint16_t>(in + 8);
  r.active_mtu = in[10];
  if (r.active_mtu < 1 || r.active_mtu > 5) bad("MTU code " + std::to_string(r.active_mtu));
  r.port = in[11];
  r.gid_index = in[12];
  for (int i : {13, 14, 15, 46, 47}) {
    if (in[i] != 0) bad("reserved bytes are not zero");
  }
  if (load_le<uint64_t>(in + 56) != 0) bad("reserved bytes are not zero");
  std::memcpy(r.gid, in + 16, 16);
  r.max_message = load_le<uint32_t>(in + 32);
  r.ctrl_size = load_le<uint32_t>(in + 36);
  r.ctrl_depth = load_le<uint32_t>(in + 40);
  r.responder_resources = in[44];
  r.initiator_depth = in[45];
  r.engine_id = load_le<uint64_t>(in + 48);
  for (int i = 0; i < n; ++i) {
    Qp q;
    q.qpn = load_le<uint32_t>(in + kHeaderSize + 8 * i);
    q.psn = load_le<uint32_t>(in + kHeaderSize + 8 * i + 4);
    if (q.qpn == 0 || q.qpn > 0xffffff) bad("QP number " + std::to_string(q.qpn));
    if (q.psn > 0xffffff) bad("PSN " + std::to_string(q.psn) + " exceeds 24 bits");
    r.qps.push_back(q);
  }
  return r;
}

}  // namespace rdmaxfer
