// RdmaConnection: a failed rail that heals rejoins the connection, with no call from the user.
//
// A rail's lanes fail over when their port goes down, a QP goes to ERR or its retries run out
// (rdma_striping.cc). Their QPs stay (in ERR) until the device itself is removed. The connecting
// side drives the healing from the transport's rail watch (heal_tick, every 0.5 s):
//   1. After the backoff, and once its own port is ACTIVE again, it resets its QPs of the rail
//      (ERR -> RESET -> INIT with new PSNs, the same QPNs) and sends REJOIN on the control lane.
//   2. The acceptor checks its side (its port ACTIVE, its device still there), resets its QPs
//      paired with them the same way, brings them to RTR/RTS with the connector's PSNs and
//      answers REJOIN_ACK with its own (or REJOIN_NAK with the cause).
//   3. The connector brings its QPs to RTR/RTS and posts a zero-length RDMA WRITE on each (the
//      probe: a zero-length WRITE names no memory, IBTA C9-88); its completion is the peer's ACK.
//   4. Every probe completed: the lanes are live again, on both sides once RAIL_UP reaches the
//      acceptor. Chunks stripe onto them from the next transfer on.
// A failed attempt (NAK, a probe error, no answer within kHealAnswerS) puts the QPs back in ERR
// and doubles the backoff: 1 s, 2 s, ... up to 60 s. A rail that fails again within kFlapS of
// rejoining (it flaps) keeps its backoff doubling instead of starting over at 1 s. A peer whose
// device was removed answers that it never will, and the rail stays failed.
// The QPs of a rail without a shared receive queue do not rejoin: the receives their reset
// dropped cannot be told apart from later ones (rdma_connection.h).
#include <algorithm>

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

// One QP of a REJOIN, REJOIN_ACK or RAIL_UP (control_msg.h).
struct Entry {
  uint32_t mine = 0;    // the sender's QPN
  uint32_t yours = 0;   // the receiver's QPN it pairs with
  uint32_t psn = 0;     // the sender's new PSN
};

std::string encode(const std::vector<Entry>& entries) {
  std::string out(entries.size() * 12, '\0');
  LeWriter w(reinterpret_cast<uint8_t*>(out.data()), out.size());
  for (const Entry& e : entries) w.put<uint32_t>(e.mine).put<uint32_t>(e.yours).put<uint32_t>(e.psn);
  return out;
}

std::vector<Entry> decode(const std::string& meta) {
  if (meta.size() % 12 != 0 || meta.empty() || meta.size() > 12 * 64) {
    throw Error(ErrorKind::kProtocol,
                "a rail REJOIN message with " + std::to_string(meta.size()) + " bytes of QPs");
  }
  std::vector<Entry> out(meta.size() / 12);
  LeReader r(reinterpret_cast<const uint8_t*>(meta.data()), meta.size());
  for (Entry& e : out) {
    e.mine = r.get<uint32_t>();
    e.yours = r.get<uint32_t>();
    e.psn = r.get<uint32_t>();
  }
  return out;
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
      {
        std::lock_guard<std::mutex> lock(mu_);
        Heal& h = heals_[r];
        for (size_t i : h.lanes) {
          lane_up_[i] = true;
          healing_[i] = false;
          entries.push_back({lanes_[i].qp->qp_num(), lanes_[i].peer.qpn, 0});
        }
        rail_up_[r] = true;  // rail_cause_ stays: describe() shows it as the last failure
        rail_by_peer_[r] = false;
        h.step = Heal::Step::kIdle;
        h.probe.reset();
        h.healed_at = now;
        ++h.rejoins;
      }
      CtrlMessage m;
      m.type = kCtrlRailUp;
      m.addr = attempt;
      m.meta = encode(entries);
      send_ctrl(m, {});
      log::write(log::Level::kWarning, "rdma endpoint to " + peer() + ": rail " + rail_name(x) +
                                           " rejoined (" + std::to_string(entries.size()) +
                                           " QP(s) reset and probed)");
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
    try {
      std::lock_guard<std::mutex> setup(setup_mu_);
      for (size_t i : lanes) {
        Lane& lane = lanes_[i];
        if (!lane.qp->on_srq()) {
          std::lock_guard<std::mutex> lock(mu_);
          heals_[r].never = "its QPs have no shared receive queue";
          break;
        }
        lane.qp->reset_to_init();
        lane.sq->revive();
        entries.push_back({lane.qp->qp_num(), lane.peer.qpn, lane.qp->psn()});
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
    m.meta = encode(entries);
    send_ctrl(m, {});
  }
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
  const std::vector<Entry> theirs = decode(m.meta);
  std::vector<size_t> lanes;
  std::string refused;
  bool for_good = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : theirs) {
      size_t found = lanes_.size();
      for (size_t i = 0; i < lanes_.size(); ++i) {
        if (lanes_[i].qp->qp_num() == e.yours && lanes_[i].peer.qpn == e.mine) found = i;
      }
      if (found == lanes_.size()) {
        refused = "no QP " + std::to_string(e.yours) + " paired with " + std::to_string(e.mine);
        for_good = true;
        break;
      }
      const size_t r = static_cast<size_t>(lanes_[found].rail);
      if (rail_released_[r] || !lanes_[found].qp->on_srq()) {
        refused = rail_released_[r] ? "its device " + rail_name(static_cast<int>(r)) +
                                          " was removed"
                                    : "its QPs on " + rail_name(static_cast<int>(r)) +
                                          " have no shared receive queue";
        for_good = true;
        break;
      }
      if (lane_up_[found]) {
        refused = "its side of the rail had not failed yet";
        break;
      }
      lanes.push_back(found);
    }
  }
  if (refused.empty()) {
    const std::string down = port_not_active(lanes_[lanes.front()].rail);
    if (!down.empty()) refused = down;
  }
  std::vector<Entry> ours;
  if (refused.empty()) {
    try {
      std::lock_guard<std::mutex> setup(setup_mu_);
      for (size_t k = 0; k < lanes.size(); ++k) {
        Lane& lane = lanes_[lanes[k]];
        lane.qp->reset_to_init();
        lane.sq->revive();
        QpAddress addr = lane.peer;
        addr.psn = theirs[k].psn;
        lane.qp->to_rtr(addr, lane.mtu, negotiated_.max_dest_rd_atomic);
        lane.qp->to_rts(negotiated_.max_rd_atomic);
        lane.peer = addr;
        ours.push_back({lane.qp->qp_num(), addr.qpn, lane.qp->psn()});
      }
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i : lanes) healing_[i] = true;
    } catch (const Error& e) {
      refused = e.what();
      for (size_t i : lanes) lanes_[i].qp->to_error();
    }
  }
  CtrlMessage reply;
  reply.addr = m.addr;
  if (refused.empty()) {
    reply.type = kCtrlRejoinAck;
    reply.meta = encode(ours);
  } else {
    reply.type = kCtrlRejoinNak;
    reply.key = for_good ? 1 : 0;
    reply.meta = refused.substr(0, std::min<size_t>(refused.size(), kRailDownCauseMax));
  }
  send_ctrl(reply, {});
}

void RdmaConnection::on_rejoin_ack(const CtrlMessage& m) {
  const std::vector<Entry> theirs = decode(m.meta);
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
    for (size_t k = 0; k < lanes.size(); ++k) {
      Lane& lane = lanes_[lanes[k]];
      const auto it = std::find_if(theirs.begin(), theirs.end(), [&](const Entry& e) {
        return e.yours == lane.qp->qp_num() && e.mine == lane.peer.qpn;
      });
      if (it == theirs.end()) throw Error(ErrorKind::kProtocol, "the peer answered for other QPs");
      QpAddress addr = lane.peer;
      addr.psn = it->psn;
      lane.qp->to_rtr(addr, lane.mtu, negotiated_.max_dest_rd_atomic);
      lane.qp->to_rts(negotiated_.max_rd_atomic);
      lane.peer = addr;
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
  const std::vector<Entry> theirs = decode(m.meta);
  std::vector<int> rails;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : theirs) {
      for (size_t i = 0; i < lanes_.size(); ++i) {
        if (lanes_[i].qp->qp_num() != e.yours || lanes_[i].peer.qpn != e.mine) continue;
        if (!healing_[i]) continue;
        healing_[i] = false;
        lane_up_[i] = true;
        const size_t r = static_cast<size_t>(lanes_[i].rail);
        if (!rail_up_[r]) {
          rail_up_[r] = true;
          rail_by_peer_[r] = false;
          heals_[r].healed_at = Clock::now();
          ++heals_[r].rejoins;
          rails.push_back(lanes_[i].rail);
        }
      }
    }
  }
  for (int r : rails) {
    log::write(log::Level::kWarning, "rdma endpoint to " + peer() + ": rail " + rail_name(r) +
                                         " rejoined (the peer's probe WRITEs completed)");
  }
}

void RdmaConnection::on_heal_completion(int lane, const ibv_wc& wc) {
  SendQueue& sq = *lanes_[static_cast<size_t>(lane)].sq;
  if (sq.stale(wc)) return;  // a flush of the QP's life before its reset
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
