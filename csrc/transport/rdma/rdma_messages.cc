// RdmaConnection: the protocol's primitives on verbs (channel.h) — control SENDs
// (control_msg.h), grants, WRITE_WITH_IMM, the receive completions that carry them up (from the
// QP's own receive buffers or the rail's SRQ), and the counts of WRs and receive buffers.
#include <arpa/inet.h>

#include <cstring>

#include "common/error.h"
#include "transport/rdma/rdma_connection.h"

namespace rdmaxfer {

ChannelLimits RdmaConnection::limits() const {
  ChannelLimits l;
  l.eager_limit = settings_.eager_limit;
  l.ctrl_room = peer_ctrl_size_ > CtrlHeader::kSize ? peer_ctrl_size_ - CtrlHeader::kSize : 0;
  std::lock_guard<std::mutex> lock(mu_);
  l.credit_window = window_;
  return l;
}

void RdmaConnection::check_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  check_open_locked();
}

void RdmaConnection::send_ctrl(const CtrlMessage& m, CtrlPayload payload) {
  CtrlHeader h = CtrlHeader::of(m, payload.length);
  h.seq = ctrl_seq_.fetch_add(1) + 1;
  SendWork w;
  w.opcode = IBV_WR_SEND;
  w.last = true;
  w.ctrl.resize(CtrlHeader::kSize + m.meta.size() + payload.length);
  auto* p = reinterpret_cast<uint8_t*>(w.ctrl.data());
  h.encode(p);
  std::memcpy(p + CtrlHeader::kSize, m.meta.data(), m.meta.size());
  // The EAGER payload is copied into the control message; its region is free after this.
  if (payload.length > 0) {
    std::memcpy(p + CtrlHeader::kSize + m.meta.size(), payload.data, payload.length);
  }
  std::vector<SendWork> works;
  if (test_ctrl_twice_) {
    SendWork again;
    again.opcode = IBV_WR_SEND;
    again.last = true;
    again.ctrl = w.ctrl;
    works.push_back(std::move(again));
  }
  works.push_back(std::move(w));
  submit(ctrl_lane(), std::move(works));
}

Grant RdmaConnection::grant(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                            uint64_t length, uint32_t value,
                            const RequestPtr& /*progress: the CQ drives it*/) {
  uint8_t* dst = local->addr() + offset;
  // The peer writes straight into dst, which needs REMOTE_WRITE, on the control rail (its
  // WRITE_WITH_IMM comes on a QP paired with one of that rail's).
  const size_t rail = static_cast<size_t>(ctrl_rail());
  std::unique_ptr<VerbsMr> temp;
  const auto* region = dynamic_cast<const RdmaRegion*>(local.get());
  uint32_t rkey = region != nullptr ? region->rkey_on(rail) : local->key();
  // A temporary MR also where the region has none on that rail (GPU memory registered before
  // the rail's device came back).
  if ((local->access() & kAccessRemoteWrite) == 0 || rkey == 0) {
    std::shared_ptr<ProtectionDomain> pd;
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_open_locked();
      pd = shared_.rails[rail].pd;
    }
    if (!pd) throw Error(ErrorKind::kConnection, "endpoint to " + peer() + ": its control rail " +
                                                     rail_name(static_cast<int>(rail)) + " was removed");
    temp = std::make_unique<VerbsMr>(pd, dst, length,
                                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    rkey = temp->rkey();
  }
  std::lock_guard<std::mutex> lock(mu_);
  check_open_locked();
  const uint64_t id = next_grant_++;
  grants_[id] = GrantHold{RegionUse(local), std::move(temp), value, length};
  return Grant{id, reinterpret_cast<uint64_t>(dst), rkey, static_cast<uint32_t>(rail)};
}

void RdmaConnection::release_grant(uint64_t id) {
  GrantHold released;  // its MR is deregistered outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = grants_.find(id);
  if (it == grants_.end()) return;  // torn down meanwhile: kept until drained
  released = std::move(it->second);
  grants_.erase(it);
}

void RdmaConnection::post_write_notify(const RequestPtr& request,
                                       const std::shared_ptr<MemoryRegion>& local,
                                       uint64_t offset, uint64_t length, uint64_t addr,
                                       uint32_t key, uint32_t route, uint32_t value,
                                       const TransferOptions& options) {
  try {
    post_chunks(OpKind::kWrite, request, local, offset, addr,
                std::make_shared<const std::vector<uint32_t>>(1, key), length,
                Notified{true, value, static_cast<int>(route)}, options);
  } catch (const Error& e) {
    request->fail(e);  // closed meanwhile: nothing was posted
  }
}

void RdmaConnection::post_recv_slot(int lane, uint32_t slot) {
  Lane& l = lanes_[static_cast<size_t>(lane)];
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(l.recv_slab->slot(slot));
  sge.length = l.recv_slab->slot_size();
  sge.lkey = l.recv_slab->lkey();
  ibv_recv_wr wr{};
  wr.wr_id = wr_prefix(tag_, lane, true) | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ibv_qp* qp = l.qp->get();
  if (qp == nullptr) {
    throw Error(ErrorKind::kConnection, "QP " + std::to_string(l.qp->qp_num()) + " on " +
                                            rail_name(l.rail) + " was destroyed with its device");
  }
  const int rc = ibv_post_recv(qp, &wr, &bad);
  if (rc != 0) throw_verbs("ibv_post_recv", rc);
  posted_recvs_[static_cast<size_t>(lane)].fetch_add(1);
}

uint64_t RdmaConnection::outstanding_wrs() const {
  uint64_t n = 0;
  for (const Lane& lane : lanes_) n += lane.sq ? lane.sq->in_flight() : 0;
  return n;
}

uint64_t RdmaConnection::posted_receives() const {
  uint64_t n = 0;
  for (size_t i = 0; i < lanes_.size(); ++i) n += static_cast<uint64_t>(posted_recvs_[i].load());
  return n;
}

uint64_t RdmaConnection::own_receive_buffers() const {
  uint64_t n = 0;
  for (const Lane& lane : lanes_) n += lane.recv_slab ? lane.recv_slab->count() : 0;
  return n;
}

std::vector<std::pair<int, uint32_t>> RdmaConnection::qp_numbers() const {
  std::vector<std::pair<int, uint32_t>> out;
  for (const Lane& lane : lanes_) out.emplace_back(lane.rail, lane.qp->qp_num());
  return out;
}

void RdmaConnection::on_srq_completion(int rail, const ibv_wc& wc, const uint8_t* data) {
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (lanes_[i].rail == rail && lanes_[i].qp->qp_num() == wc.qp_num) {
      complete(static_cast<int>(i), true, wc, data);
      return;
    }
  }
  // A QP this connection dropped while pairing (no peer QP): nothing was sent to it.
}

void RdmaConnection::on_recv(int lane, const ibv_wc& wc, const uint8_t* srq_data) {
  const uint32_t slot = static_cast<uint32_t>(wc.wr_id & 0xffffffffu);
  Lane& l = lanes_[static_cast<size_t>(lane)];
  // Its own receive buffer goes back to the QP as soon as its bytes are copied out; an SRQ's
  // goes back to the SRQ when this returns (the transport reposts it).
  const bool own = srq_data == nullptr;
  if (own && (!l.recv_slab || slot >= l.recv_slab->count())) {
    throw Error(ErrorKind::kProtocol, "receive completion for unknown slot");
  }
  const uint8_t* p = own ? l.recv_slab->slot(slot) : srq_data;
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    follow_ctrl_lane(lane);
    if (own) post_recv_slot(lane, slot);
    const uint32_t value = ntohl(wc.imm_data);
    uint64_t landed = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, g] : grants_) {
        if (g.value == value) landed = g.length;
      }
    }
    stats_->add_lane(lane, landed);  // every chunk of a notified WRITE comes on one QP
    rail_bytes_[static_cast<size_t>(l.rail)] += landed;
    events()->on_notify(value);
    return;
  }
  if (wc.opcode != IBV_WC_RECV) {
    throw Error(ErrorKind::kProtocol, "unexpected receive opcode " + std::to_string(wc.opcode));
  }
  const CtrlHeader h = CtrlHeader::decode(p, wc.byte_len);
  CtrlMessage m = h.message(p + CtrlHeader::kSize);
  if (own) post_recv_slot(lane, slot);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ctrl_seen_.first(h.seq)) {
      ctrl_repeats_.fetch_add(1);  // sent again after a failover, and received both times
      return;
    }
  }
  if (m.type == kCtrlRejoin) return on_rejoin(m);
  if (m.type == kCtrlRejoinAck) return on_rejoin_ack(m);
  if (m.type == kCtrlRejoinNak) return on_rejoin_nak(m);
  if (m.type == kCtrlRailUp) return on_rail_up(m);
  if (m.type == kCtrlRailBack) return on_rail_back(m);
  if (m.type == kCtrlRailDown) {
    // Before following the control lane: the failover then names the peer's cause.
    peer_rail_down(static_cast<int>(std::min<uint64_t>(m.addr, EndpointRecord::kMaxRails)),
                   m.meta);
    return;
  }
  follow_ctrl_lane(lane);
  events()->on_ctrl(std::move(m));
}

}  // namespace rdmaxfer
