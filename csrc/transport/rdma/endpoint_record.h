// The endpoint record: what each side of a verbs connection sends the other over the bootstrap
// TCP stream (after Hello/HelloAck, see transport/bootstrap.h) to connect its QPs.
//
// The connecting side sends its record first; the accepting side answers with its own, creating
// as many QPs as the connector asked for. Then both bring their QPs to RTS and exchange one
// READY byte (0x52), so neither side sends before the other can receive.
//
// Record, little-endian, version 2, 64 bytes + 8 per QP:
//    0 magic "RXEP"        4 version u16          6 link_layer u8 (1 InfiniBand, 2 Ethernet)
//    7 n_qps u8 (1..64)    8 lid u16             10 active_mtu u8 (ibv_mtu: 1=256 .. 5=4096)
//   11 port u8            12 gid_index u8        13 reserved (3 bytes, 0)
//   16 gid (16 bytes, network order; ::ffff:a.b.c.d for IPv4 RoCE v2)
//   32 max_message u32 (the port's max_msg_sz)   36 ctrl_size u32 (bytes per control receive
//                                                   buffer: the largest SEND the peer accepts)
//   40 ctrl_depth u32 (control receive buffers posted per QP)
//   44 responder_resources u8 (RDMA READs this side serves at once, max_qp_rd_atom)
//   45 initiator_depth u8 (RDMA READs this side keeps outstanding, max_qp_init_rd_atom)
//   46 reserved (2 bytes, 0)
//   48 engine_id u64       56 reserved u64 (0)
//   64 per QP i: qpn u32 at 64+8i, initial psn u32 at 68+8i (24 bits)
// Both sides use path_mtu = min(own active_mtu, peer active_mtu), max_rd_atomic = min(own
// initiator_depth, peer responder_resources), max_dest_rd_atomic = min(own
// responder_resources, peer initiator_depth); 0 from the peer counts as 1. A record with another magic,
// version or link layer is refused with a ProtocolError / ConnectionFailedError.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rdmaxfer {

struct EndpointRecord {
  static constexpr size_t kHeaderSize = 64;
  static constexpr uint16_t kVersion = 2;
  static constexpr int kMaxQps = 64;
  static constexpr uint8_t kReadyByte = 0x52;
  static constexpr uint8_t kLinkInfiniBand = 1;
  static constexpr uint8_t kLinkEthernet = 2;

  uint8_t link_layer = kLinkEthernet;
  uint16_t lid = 0;
  uint8_t active_mtu = 0;
  uint8_t port = 1;
  uint8_t gid_index = 0;
  uint8_t gid[16] = {0};
  uint32_t max_message = 0;
  uint32_t ctrl_size = 0;
  uint32_t ctrl_depth = 0;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint64_t engine_id = 0;
  struct Qp {
    uint32_t qpn = 0;
    uint32_t psn = 0;
  };
  std::vector<Qp> qps;

  static size_t size_for(int n_qps) { return kHeaderSize + 8 * static_cast<size_t>(n_qps); }
  std::string pack() const;
  // Validates the fixed header; returns n_qps so the caller can read the rest.
  static int peek_qps(const uint8_t* header);  // throws Error(kProtocol)
  static EndpointRecord unpack(const uint8_t* data, size_t size);  // throws Error(kProtocol)
};

}  // namespace rdmaxfer
