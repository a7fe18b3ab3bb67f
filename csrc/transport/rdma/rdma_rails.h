// The rails of a verbs engine: the devices (ports) one engine runs on at once.
//
// A rail is one opened device port (DeviceContext) with its own PD, completion channel, CQs
// (CqSet: created on demand on that channel, cq_set.h), completion thread (CqPoller) and shared
// receive queue (verbs_srq.h) for the two-sided receives of all its QPs. Every
// registration makes an MR in each rail's PD (RdmaRegion), so a descriptor carries an rkey per
// rail; every connection holds QPs on each pair of rails the two sides share
// (endpoint_record.h: rails_reach), and stripes large one-sided transfers over them in
// proportion to link speed (rdma_connection.h).
//
// Which devices: Engine(rdma_devices=[...]) or rdma_device=, else env RDMAXFER_RDMA_DEVICES
// (names separated by commas or spaces; "auto" = every device with an active port), else env
// RDMAXFER_RDMA_DEVICE, else the first device with an active port.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/rdma/cq_poller.h"
#include "transport/rdma/cq_set.h"
#include "transport/rdma/endpoint_record.h"
#include "transport/rdma/rdma_config.h"
#include "transport/rdma/verbs_cq.h"
#include "transport/rdma/verbs_pd.h"
#include "transport/rdma/verbs_srq.h"

namespace rdmaxfer {

// Every handle below is reset when the rail's device is removed (its name and record stay,
// `removed` says why): see RdmaTransport::remove_rail.
struct Rail {
  std::string name;     // the device's name, e.g. "rxe0"
  std::string removed;  // why the device was released (empty while the rail holds it)
  std::shared_ptr<DeviceContext> context;
  std::shared_ptr<ProtectionDomain> pd;
  std::shared_ptr<CompletionChannel> channel;
  std::shared_ptr<CqSet> cqs;  // the CQs of this rail's QPs, on `channel`, served by `poller`
  std::shared_ptr<CqPoller> poller;
  // The rail's SRQ, which every QP on it takes its receives from (verbs_srq.h); null where the
  // device has none or it is turned off: each QP then posts its own, and `srq_off` says why.
  std::shared_ptr<SharedReceiveQueue> srq;
  std::string srq_off;
  EndpointRecord::Rail record;  // what the peer learns about it
  uint32_t returns = 0;         // times its device came back (RdmaTransport::readd_rail)

  // A Rail holding this one's verbs handles (context, PD, channel, CQs, poller, SRQ), which
  // this one no longer holds: its name, cause and record stay. For releasing a removed device's
  // handles outside a lock.
  Rail take_handles() {
    Rail out;
    out.context = std::move(context);
    out.pd = std::move(pd);
    out.channel = std::move(channel);
    out.cqs = std::move(cqs);
    out.poller = std::move(poller);
    out.srq = std::move(srq);
    return out;
  }
  // Takes `back`'s handles, SRQ state, record and return count: its device came back
  // (RdmaTransport::readd_rail). The name and `removed` stay as they are.
  void adopt_handles(const Rail& back) {
    context = back.context;
    pd = back.pd;
    channel = back.channel;
    cqs = back.cqs;
    poller = back.poller;
    srq = back.srq;
    srq_off = back.srq_off;
    record = back.record;
    returns = back.returns;
  }
};

// The device names to open, in rail order ("" once: the default device). Throws
// Error(kInvalidArgument) for a repeated name or more than EndpointRecord::kMaxRails, and
// Error(kUnsupported) when "auto" finds no active port.
std::vector<std::string> rail_devices(const RdmaConfig& config);

// The port's data rate in Mb/s from its active_speed and active_width (0: unknown).
uint32_t link_speed_mbps(uint8_t active_speed, uint8_t active_width);

// The record of an opened port: link layer, LID, MTU, GID, speed and, on RoCE with an
// IPv4-mapped GID, the prefix length of the local interface address it carries (getifaddrs).
EndpointRecord::Rail rail_record(const DeviceContext& dc);

// "rxe0 (10.77.0.1/24, 10000 Mb/s)" for messages.
std::string rail_text(const std::string& name, const EndpointRecord::Rail& r);

// Why no QP pairs: "no rail of this engine (...) reaches a rail of the peer (...)".
std::string no_rail_pair(const std::vector<Rail>& ours, const EndpointRecord& peer);

}  // namespace rdmaxfer
