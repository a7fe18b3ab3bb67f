// RdmaConnection: a failed rail that heals rejoins the connection, with no call from the user.
//
// A rail's lanes fail over when their port goes down, a QP goes to ERR or its retries run out
// (rdma_striping.cc). Their QPs stay (in ERR) until the device itself is removed. The connecting
// side drives the healing from the transport's rail watch (heal_tick, every 0.5 s):
//   1. After the backoff, and once its own port is ACTIVE again, it renews its QPs of the rail
//      (each destroyed and made again on the same PD, CQ and SRQ: new QPNs and PSNs; a QP reset
//      in place kept state of its last life on rxe) and sends REJOIN on the control lane.
//   2. The acceptor checks its side (its port ACTIVE, its device still there), renews its QPs
//      paired with them the same way, brings them to RTR/RTS with the connector's QPNs and
//      PSNs and answers REJOIN_ACK with its own (or REJOIN_NAK with the cause).
//   3. The connector brings its QPs to RTR/RTS and posts a zero-length RDMA WRITE on each (the
//      probe: a zero-length WRITE names no memory, IBTA C9-88); its completion is the peer's ACK.
//   4. Every probe completed: the lanes are live again, on both sides once RAIL_UP reaches the
//      acceptor. Chunks stripe onto them from the next transfer on.
// A failed attempt (NAK, a probe error, no answer within kHealAnswerS) puts the QPs back in ERR
// and doubles the backoff: 1 s, 2 s, ... up to 60 s. A rail that fails again within kFlapS of
// rejoining (it flaps) keeps its backoff doubling instead of starting over at 1 s.
// A removed device that comes back (rdma_transport.h) heals the same way with new QPs on that
// side (rail_back): REJOIN and REJOIN_ACK carry each side's QPNs, by lane index, and its rail's
// address and generation, so the other side brings its QPs up to the new ones and uses that
// rail's rkeys only from descriptors as new as its return. The side whose device came back
// asks at once when it is the connector, and tells the connector to (RAIL_BACK) when it is
// the acceptor.
// The QPs of a rail without a shared receive queue do not rejoin: the receives their reset
// dropped cannot be told apart from later ones (rdma_connection.h).
#include <algorithm>
#include <cstring>
#include <utility>

#include "common/error.h"
#include "common/le_codec.h"
#include "common/log.h"
#include "transport/rdma/control_msg.h"
#include "transport/rdma/rdma_connection.h"

namespace rdmaxfer {

namespace {
using Clock = std::chrono::steady_clock;

constexpr double kHealFirstS = 1.0;
constexpr double kHealMaxS = 60.0;
constexpr double kFlapS = 30.0;
constexpr double kHealAnswerS = 5.0;

// The sender's rail in a REJOIN, REJOIN_ACK or RAIL_UP (control_msg.h).
struct RailAddr {
  uint8_t gid[16] = {0};
  uint16_t lid = 0;
  uint8_t mtu = 0;  // ibv_mtu code
  uint16_t generation = 0;
};

// One QP of the same messages.
struct Entry {
  uint32_t lane = 0;   // index in lanes_, the same on both sides
  uint32_t mine = 0;   // the sender's QPN
  uint32_t yours = 0;  // the receiver's QPN it pairs with, as the sender knows it
  uint32_t psn = 0;    // the sender's new PSN
};

constexpr size_t kAddrSize = 24;
constexpr size_t kEntrySize = 16;

std::string encode(const RailAddr& addr, const std::vector<Entry>& entries) {
  std::string out(kAddrSize + entries.size() * kEntrySize, '\0');
  LeWriter w(reinterpret_cast<uint8_t*>(out.data()), out.size());
  w.bytes(addr.gid, 16).put<uint16_t>(addr.lid).put<uint8_t>(addr.mtu).skip(1);
  w.put<uint16_t>(addr.generation).skip(2);
  for (const Entry& e : entries) {
    w.put<uint32_t>(e.lane).put<uint32_t>(e.mine).put<uint32_t>(e.yours).put<uint32_t>(e.psn);
  }
  return out;
}

std::pair<RailAddr, std::vector<Entry>> decode(const std::string& meta) {
  const size_t n = meta.size() < kAddrSize ? 0 : (meta.size() - kAddrSize) / kEntrySize;
  if (n == 0 || n > static_cast<size_t>(EndpointRecord::kMaxQps) ||
      meta.size() != kAddrSize + n * kEntrySize) {
    throw Error(ErrorKind::kProtocol,
                "a rail REJOIN message with " + std::to_string(meta.size()) + " bytes of QPs");
  }
  RailAddr addr;
  LeReader r(reinterpret_cast<const uint8_t*>(meta.data()), meta.size());
  r.copy(addr.gid, 16);
  addr.lid = r.get<uint16_t>();
  addr.mtu = r.get<uint8_t>();
  addr.generation = r.skip(1).get<uint16_t>();
  r.skip(2);
  if (addr.mtu < IBV_MTU_256 || addr.mtu > IBV_MTU_4096) {
    throw Error(ErrorKind::kProtocol, "a rail REJOIN message with MTU code " +
                                          std::to_string(addr.mtu));
  }
  std::vector<Entry> out(n);
  for (Entry& e : out) {
    e.lane = r.get<uint32_t>();
    e.mine = r.get<uint32_t>();
    e.yours = r.get<uint32_t>();
    e.psn = r.get<uint32_t>();
  }
  return {addr, std::move(out)};
}

RailAddr addr_of(const EndpointRecord::Rail& record) {
  RailAddr a;
  std::memcpy(a.gid, record.gid, 16);
  a.lid = record.lid;
  a.mtu = record.active_mtu;
  a.generation = record.generation;
  return a;
}

// Where the sender's QP of `e` is, as `lane` is brought up to it.
QpAddress address_of(const RailAddr& addr, const Entry& e) {
  QpAddress a;
  a.qpn = e.mine;
  a.psn = e.psn;
  a.lid = addr.lid;
  std::memcpy(a.gid.raw, addr.gid, 16);
  return a;
}

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}
}  // namespace

void RdmaConnection::schedule_heal_locked(size_t rail) {
  Heal& h = heals_[rail];
  if (h.step != Heal::Step::kIdle) return;
  const bool flapped =
      h.rejoins > 0 && Clock::now() - h.healed_at < std::chrono::duration<double>(kFlapS);
  h.backoff_s = flapped ? std::min(kHealMaxS, std::max(kHealFirstS, h.backoff_s * 2)) : kHealFirstS;
  h.next_try = after(h.backoff_s);
}

void RdmaConnection::heal_tick() {
  if (state() != State::kConnected) return;
  const Clock::time_point now = Clock::now();
  for (int x : used_rails()) {
    const size_t r = static_cast<size_t>(x);
    std::vector<size_t> lanes;
    RequestPtr probe;
    uint64_t attempt = 0;
    bool expired = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Heal& h = heals_[r];
      if (acceptor_ || rail_released_[r] || !h.never.empty()) continue;
      attempt = h.attempt;
      if (h.step == Heal::Step::kProbing && h.probe && h.probe->done()) {
        probe = h.probe;
      } else if (h.step != Heal::Step::kIdle) {
        expired = now > h.deadline;
      } else if (now >= h.next_try) {
        for (size_t i = 0; i < lanes_.size(); ++i) {
          if (lanes_[i].rail == x && !lane_up_[i] && !healing_[i]) lanes.push_back(i);
        }
      }
    }
    if (probe) {
      if (probe->state() != Request::State::kDone) {
        heal_failed(r, attempt, "its probe WRITE failed", false);
        continue;
      }
      std::vector<Entry> entries;
      RailAddr addr;
      {
        std::lock_guard<std::mutex> lock(mu_);
        Heal& h = heals_[r];
        addr = addr_of(shared_.rails[r].record);
        for (size_t i : h.lanes) {
          lane_up_[i] = true;
          healing_[i] = false;
          entries.push_back({static_cast<uint32_t>(i), lanes_[i].qp->qp_num(), lanes_[i].peer.qpn,
                             0});
        }
        rail_up_[r] = true;  // rail_cause_ stays: describe() shows it as the last failure
        meter_.forget(r);
        rail_by_peer_[r] = false;
        h.step = Heal::Step::kIdle;
        h.probe.reset();
        h.healed_at = now;
        ++h.rejoins;
      }
      CtrlMessage m;
      m.type = kCtrlRailUp;
      m.addr = attempt;
      m.meta = encode(addr, entries);
      send_ctrl(m, {});
      log::write(log::Level::kWarning, "rdma endpoint to " + peer() + ": rail " + rail_name(x) +
                                           " rejoined (" + std::to_string(entries.size()) +
                                           " QP(s) renewed and probed)");
      continue;
    }
    if (expired) {
      heal_failed(r, attempt, "the peer did not answer within " +
                                  std::to_string(static_cast<int>(kHealAnswerS)) + " s", false);
      continue;
    }
    if (lanes.empty()) continue;
    if (!port_not_active(x).empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      heals_[r].next_try = after(heals_[r].backoff_s);  // try when the port is back
      continue;
    }
    std::vector<Entry> entries;
    RailAddr addr;
    try {
      std::lock_guard<std::mutex> setup(setup_mu_);
      {
        std::lock_guard<std::mutex> lock(mu_);
        addr = addr_of(shared_.rails[r].record);
      }
      for (size_t i : lanes) {
        Lane& lane = lanes_[i];
        if (!lane.qp->on_srq()) {
          std::lock_guard<std::mutex> lock(mu_);
          heals_[r].never = "its QPs have no shared receive queue";
          break;
        }
        renew(lane);
        entries.push_back(
            {static_cast<uint32_t>(i), lane.qp->qp_num(), lane.peer.qpn, lane.qp->psn()});
      }
    } catch (const Error& e) {
      heal_failed(r, attempt, e.what(), false);
      continue;
    }
    if (entries.size() != lanes.size()) continue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Heal& h = heals_[r];
      attempt = ++h.attempt;
      h.step = Heal::Step::kAsked;
      h.lanes = lanes;
      h.deadline = after(kHealAnswerS);
      for (size_t i : lanes) healing_[i] = true;
    }
    CtrlMessage m;
    m.type = kCtrlRejoin;
    m.addr = attempt;
    m.meta = encode(addr, entries);
    send_ctrl(m, {});
  }
}

void RdmaConnection::renew(Lane& lane) {
  const uint32_t old_qpn = lane.qp->qp_num();
  lane.qp->renew();
  lane.sq->revive();
  if (shared_.renumbered) shared_.renumbered(lane.rail, old_qpn, lane.qp->qp_num());
}

void RdmaConnection::heal_failed(size_t rail, uint64_t attempt, const std::string& why,
                                 bool for_good) {
  std::vector<size_t> lanes;
  double backoff = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Heal& h = heals_[rail];
    if (h.attempt != attempt) return;
    lanes = std::move(h.lanes);
    h.lanes.clear();
    h.step = Heal::Step::kIdle;
    h.probe.reset();
    for (size_t i : lanes) healing_[i] = false;
    h.backoff_s = std::min(kHealMaxS, std::max(kHealFirstS, h.backoff_s * 2));
    h.next_try = after(h.backoff_s);
    backoff = h.backoff_s;
    if (for_good) h.never = why;
  }
  for (size_t i : lanes) lanes_[i].qp->to_error();
  log::write(log::Level::kInfo,
             "rdma endpoint to " + peer() + ": rail " + rail_name(static_cast<int>(rail)) +
                 " did not rejoin (" + why + ")" +
                 (for_good ? "; it will not be tried again"
                           : "; next try in " + std::to_string(static_cast<int>(backoff)) + " s"));
}

void RdmaConnection::on_rejoin(const CtrlMessage& m) {
  const auto [addr, theirs] = decode(m.meta);
  std::vector<size_t> lanes;
  std::string refused;
  bool for_good = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : theirs) {
      if (e.lane >= lanes_.size() ||
          (!lanes.empty() && lanes_[e.lane].peer_rail != lanes_[lanes.front()].peer_rail)) {
        refused = "no QP pairs with " + std::to_string(e.mine) + " as lane " +
                  std::to_string(e.lane);
        for_good = true;
        break;
      }
      const size_t r = static_cast<size_t>(lanes_[e.lane].rail);
      if (rail_released_[r]) {  // it may come back: then RAIL_BACK says so
        refused = "its device " + rail_name(static_cast<int>(r)) + " was removed";
        break;
      }
      if (!lanes_[e.lane].qp->on_srq()) {
        refused = "its QPs on " + rail_name(static_cast<int>(r)) +
                  " have no shared receive queue";
        for_good = true;
        break;
      }
      if (lane_up_[e.lane]) {
        refused = "its side of the rail had not failed yet";
        break;
      }
      lanes.push_back(e.lane);
    }
  }
  if (refused.empty()) {
    const std::string down = port_not_active(lanes_[lanes.front()].rail);
    if (!down.empty()) refused = down;
  }
  std::vector<Entry> ours;
  RailAddr mine;
  if (refused.empty()) {
    try {
      std::lock_guard<std::mutex> setup(setup_mu_);
      const size_t r = static_cast<size_t>(lanes_[lanes.front()].rail);
      {
        std::lock_guard<std::mutex> lock(mu_);
        mine = addr_of(shared_.rails[r].record);
      }
      const auto mtu = static_cast<ibv_mtu>(std::min(addr.mtu, mine.mtu));
      std::vector<QpAddress> peers;
      for (size_t k = 0; k < lanes.size(); ++k) {
        Lane& lane = lanes_[lanes[k]];
        renew(lane);
        peers.push_back(address_of(addr, theirs[k]));
        lane.qp->to_rtr(peers.back(), mtu, negotiated_.max_dest_rd_atomic);
        lane.qp->to_rts(negotiated_.max_rd_atomic);
        ours.push_back({static_cast<uint32_t>(lanes[k]), lane.qp->qp_num(), peers.back().qpn,
                        lane.qp->psn()});
      }
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t k = 0; k < lanes.size(); ++k) {
        lanes_[lanes[k]].peer = peers[k];
        lanes_[lanes[k]].mtu = mtu;
        healing_[lanes[k]] = true;
      }
      const size_t c = static_cast<size_t>(lanes_[lanes.front()].peer_rail);
      if (c < peer_generation_.size()) {
        peer_generation_[c] = std::max(peer_generation_[c], addr.generation);
      }
    } catch (const Error& e) {
      refused = e.what();
      for (size_t i : lanes) lanes_[i].qp->to_error();
    }
  }
  CtrlMessage reply;
  reply.addr = m.addr;
  if (refused.empty()) {
    reply.type = kCtrlRejoinAck;
    reply.meta = encode(mine, ours);
  } else {
    reply.type = kCtrlRejoinNak;
    reply.key = for_good ? 1 : 0;
    reply.meta = refused.substr(0, std::min<size_t>(refused.size(), kRailDownCauseMax));
  }
  send_ctrl(reply, {});
}

void RdmaConnection::on_rejoin_ack(const CtrlMessage& m) {
  const auto [addr, theirs] = decode(m.meta);
  size_t rail = 0;
  std::vector<size_t> lanes;
  RequestPtr probe;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bool found = false;
    for (size_t r = 0; r < heals_.size() && !found; ++r) {
      if (heals_[r].step == Heal::Step::kAsked && heals_[r].attempt == m.addr) {
        rail = r;
        lanes = heals_[r].lanes;
        found = true;
      }
    }
    if (!found) return;  // an attempt given up meanwhile
  }
  if (theirs.size() != lanes.size()) {
    heal_failed(rail, m.addr, "the peer answered for other QPs", false);
    return;
  }
  try {
    std::lock_guard<std::mutex> setup(setup_mu_);
    uint8_t own_mtu = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      own_mtu = shared_.rails[rail].record.active_mtu;
    }
    const auto mtu = static_cast<ibv_mtu>(std::min(addr.mtu, own_mtu));
    std::vector<QpAddress> peers;
    for (size_t k = 0; k < lanes.size(); ++k) {
      Lane& lane = lanes_[lanes[k]];
      const auto it = std::find_if(theirs.begin(), theirs.end(), [&](const Entry& e) {
        return e.lane == lanes[k] && e.yours == lane.qp->qp_num();
      });
      if (it == theirs.end()) throw Error(ErrorKind::kProtocol, "the peer answered for other QPs");
      peers.push_back(address_of(addr, *it));
      lane.qp->to_rtr(peers.back(), mtu, negotiated_.max_dest_rd_atomic);
      lane.qp->to_rts(negotiated_.max_rd_atomic);
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t k = 0; k < lanes.size(); ++k) {
      lanes_[lanes[k]].peer = peers[k];
      lanes_[lanes[k]].mtu = mtu;
    }
    const size_t c = static_cast<size_t>(lanes_[lanes.front()].peer_rail);
    if (c < peer_generation_.size()) {
      peer_generation_[c] = std::max(peer_generation_[c], addr.generation);
    }
  } catch (const Error& e) {
    heal_failed(rail, m.addr, e.what(), false);
    return;
  }
  probe = new_request(OpKind::kWrite, 0);
  probe->set_parts(lanes.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    Heal& h = heals_[rail];
    if (h.attempt != m.addr || h.step != Heal::Step::kAsked) return;
    h.step = Heal::Step::kProbing;
    h.probe = probe;
    h.deadline = after(kHealAnswerS);
  }
  for (size_t i : lanes) {
    SendWork w;
    w.opcode = IBV_WR_RDMA_WRITE;  // zero-length: no SGE, no memory named (C9-88)
    w.request = probe;
    w.last = true;
    if (!lanes_[i].sq->submit(std::move(w)).empty()) {
      heal_failed(rail, m.addr, "its send queue failed again", false);
      return;
    }
  }
}

void RdmaConnection::on_rejoin_nak(const CtrlMessage& m) {
  size_t rail = heals_.size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t r = 0; r < heals_.size(); ++r) {
      if (heals_[r].step == Heal::Step::kAsked && heals_[r].attempt == m.addr) rail = r;
    }
  }
  if (rail == heals_.size()) return;
  heal_failed(rail, m.addr, "the peer: " + m.meta, m.key == 1);
}

void RdmaConnection::on_rail_up(const CtrlMessage& m) {
  const std::vector<Entry> theirs = decode(m.meta).second;
  std::vector<int> rails;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : theirs) {
      const size_t i = e.lane;
      if (i >= lanes_.size() || lanes_[i].qp->qp_num() != e.yours ||
          lanes_[i].peer.qpn != e.mine || !healing_[i]) {
        continue;
      }
      healing_[i] = false;
      lane_up_[i] = true;
      const size_t r = static_cast<size_t>(lanes_[i].rail);
      if (!rail_up_[r]) {
        rail_up_[r] = true;
        rail_by_peer_[r] = false;
        meter_.forget(r);
        heals_[r].healed_at = Clock::now();
        ++heals_[r].rejoins;
        rails.push_back(lanes_[i].rail);
      }
    }
  }
  for (int r : rails) {
    log::write(log::Level::kWarning, "rdma endpoint to " + peer() + ": rail " + rail_name(r) +
                                         " rejoined (the peer's probe WRITEs completed)");
  }
}

void RdmaConnection::on_rail_back(const CtrlMessage& m) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (static_cast<uint64_t>(lanes_[i].peer_rail) != m.addr) continue;
    Heal& h = heals_[static_cast<size_t>(lanes_[i].rail)];
    if (h.step != Heal::Step::kIdle) continue;
    h.backoff_s = 0;
    h.next_try = Clock::now();  // the next heal_tick asks
  }
}

int RdmaConnection::qps_on(int rail) const {
  return static_cast<int>(std::count_if(lanes_.begin(), lanes_.end(),
                                        [rail](const Lane& l) { return l.rail == rail; }));
}

bool RdmaConnection::rail_back(int rail, const Rail& back, std::shared_ptr<CompletionQueue> cq) {
  const size_t r = static_cast<size_t>(rail);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kClosed || !rail_released_[r]) return false;
  }
  std::string never;
  {
    // Against release_rail and a heal on another thread: the QPs change here only.
    std::lock_guard<std::mutex> setup(setup_mu_);
    for (Lane& lane : lanes_) {
      if (lane.rail != rail) continue;
      if (lane.recv_slab || !back.srq) {
        never = "its QPs have no shared receive queue";
        continue;
      }
      lane.send_slab->register_in(back.pd);
      lane.qp->recreate(back.pd, cq, back.srq);
      lane.sq->revive();
    }
  }
  bool acceptor = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shared_.rails[r].adopt_handles(back);
    shared_.cqs[r] = std::move(cq);
    rail_released_[r] = false;
    Heal& h = heals_[r];
    h.never = never;
    h.step = Heal::Step::kIdle;
    h.lanes.clear();
    h.probe.reset();
    h.backoff_s = 0;
    h.next_try = Clock::now();
    acceptor = acceptor_;
  }
  if (acceptor && never.empty() && state() == State::kConnected) {
    CtrlMessage m;
    m.type = kCtrlRailBack;
    m.addr = r;
    try {
      send_ctrl(m, {});
    } catch (const Error& e) {
      log::write(log::Level::kInfo, "rdma endpoint to " + peer() + ": RAIL_BACK for " +
                                        rail_name(rail) + " not sent (" + e.what() + ")");
    }
  }
  log::write(log::Level::kInfo, "rdma endpoint to " + peer() + ": rail " + rail_name(rail) +
                                    " has QPs again (its device came back); rejoining");
  return true;
}

void RdmaConnection::on_heal_completion(int lane, const ibv_wc& wc) {
  SendQueue& sq = *lanes_[static_cast<size_t>(lane)].sq;
  if (sq.stale(wc)) return;  // a flush of the lane's QP before it was renewed
  Retired r = sq.retire(wc);
  if (wc.status != IBV_WC_SUCCESS) {
    if (r.failed) {
      r.failed->fail(ErrorKind::kConnection,
                     std::string("rail probe WRITE failed: ") + wc_status_text(wc.status));
    }
    return;
  }
  finish_parts(r.parts_done);
}

}  // namespace rdmaxfer
