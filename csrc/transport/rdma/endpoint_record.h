// The endpoint record: what each side of a verbs connection sends the other over the bootstrap
// TCP stream (after Hello/HelloAck, see transport/bootstrap.h) to connect its QPs.
//
// The connecting side sends its record first; the accepting side answers with its own, creating
// as many QPs as the connector asked for. Then both bring their QPs to RTS and exchange one
// READY byte (0x52), so neither side sends before the other can receive.
//
// Rails: an engine may run on several devices (rails, see rdma_rails.h). Rail 0 is described in
// the header; rails 1.. follow the QP list, 32 bytes each. Every QP names its rail and the
// peer's rail it pairs with: the connector offers QPs on each of its rails (peer rail 0xff),
// the acceptor answers with QPs only for the connector rails one of its rails reaches, each
// naming the connector rail; the connector then drops its QPs that no acceptor QP names. An
// acceptor none of whose rails reaches the connector's answers with no QP, and both fail.
//
// Record, little-endian, version 2, 64 bytes + 8 per QP + 32 per rail after the first:
//    0 magic "RXEP"        4 version u16          6 link_layer u8 (1 InfiniBand, 2 Ethernet)
//    7 n_qps u8 (0..64)    8 lid u16             10 active_mtu u8 (ibv_mtu: 1=256 .. 5=4096)
//   11 port u8            12 gid_index u8        13 n_rails - 1 u8 (0: one rail)
//   14 prefix_len u8 (IPv4 prefix of the address the RoCE GID carries; 0: unknown)
//   15 reserved (1 byte, 0)
//   16 gid (16 bytes, network order; ::ffff:a.b.c.d for IPv4 RoCE v2)
//   32 max_message u32 (the port's max_msg_sz)   36 ctrl_size u32 (bytes per control receive
//                                                   buffer: the largest SEND the peer accepts)
//   40 ctrl_depth u32 (control receive buffers posted per QP)
//   44 responder_resources u8 (RDMA READs this side serves at once, max_qp_rd_atom)
//   45 initiator_depth u8 (RDMA READs this side keeps outstanding, max_qp_init_rd_atom)
//   46 generation u16 of rail 0 (below)
//   48 engine_id u64       56 link speed u32 (Mb/s, rail 0; 0: unknown)   60 reserved u32 (0)
//   64 per QP i: at 64+8i qpn (bits 0-23) | this side's rail << 24, at 68+8i initial psn
//      (bits 0-23) | the peer rail it pairs with << 24 (0xff: not chosen yet)
//   then per rail r >= 1: link_layer u8, active_mtu u8, port u8, gid_index u8, lid u16,
//      prefix_len u8, reserved u8, speed u32 (Mb/s), generation u16, reserved u16, gid (16 bytes)
// A rail's generation: the engine's descriptor generation (core/descriptor.h) when its device
// last came back, 0 if it never went; the peer uses that rail's keys only from descriptors at
// least as new.
// Two rails reach each other when their link layers match and, on InfiniBand, the GID subnet
// prefixes match; on RoCE, when both IPv4 networks (address and prefix_len) match (an unknown
// prefix counts as reachable).
// Each QP pair uses path_mtu = min(own active_mtu, peer active_mtu) of its two rails, max_rd_atomic = min(own
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
  static constexpr size_t kRailSize = 32;
  static constexpr int kMaxRails = 16;
  static constexpr uint8_t kAnyRail = 0xff;

  struct Rail {
    uint8_t link_layer = kLinkEthernet;
    uint16_t lid = 0;
    uint8_t active_mtu = 0;
    uint8_t port = 1;
    uint8_t gid_index = 0;
    uint8_t prefix_len = 0;
    uint32_t speed_mbps = 0;
    uint16_t generation = 0;
    uint8_t gid[16] = {0};
  };
  std::vector<Rail> rails;  // at least one
  uint32_t max_message = 0;
  uint32_t ctrl_size = 0;
  uint32_t ctrl_depth = 0;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint64_t engine_id = 0;
  struct Qp {
    uint32_t qpn = 0;
    uint32_t psn = 0;
    uint8_t rail = 0;                 // this side's rail
    uint8_t peer_rail = kAnyRail;     // the peer's rail it pairs with
  };
  std::vector<Qp> qps;

  static size_t size_for(int n_qps, int n_rails = 1) {
    return kHeaderSize + 8 * static_cast<size_t>(n_qps) +
           kRailSize * static_cast<size_t>(n_rails - 1);
  }
  std::string pack() const;
  // Validates the fixed header; returns the size of the whole record.
  static size_t peek_size(const uint8_t* header);  // throws Error(kProtocol)
  static EndpointRecord unpack(const uint8_t* data, size_t size);  // throws Error(kProtocol)
};

// True for an IPv4-mapped GID (::ffff:a.b.c.d, RoCE v2 over IPv4).
bool gid_is_ipv4(const uint8_t* gid);

// True when rail `a` of one side and rail `b` of the other can reach each other (see above).
bool rails_reach(const EndpointRecord::Rail& a, const EndpointRecord::Rail& b);

}  // namespace rdmaxfer
