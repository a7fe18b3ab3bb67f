// RdmaConnection on several rails: which QPs a one-sided transfer's chunks go on (striping by
// link speed, the home rail for small ones) and, when a data rail fails, moving its chunks to
// the live rails (failover). Set-up and teardown are in rdma_connection.cc, completions in
// rdma_completions.cc.
#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "transport/chunking.h"
#include "transport/rdma/rdma_connection.h"

namespace rdmaxfer {

namespace {
// The payload of the works that are parts of a request (not control SENDs), as
// SendQueue::retire counts them.
uint64_t part_bytes(const std::vector<SendWork>& works) {
  uint64_t n = 0;
  for (const SendWork& w : works) n += w.request ? w.length : 0;
  return n;
}

// Striped shares are whole pages (the largest takes the remainder).
constexpr uint64_t kShareAlign = 4096;
}  // namespace

std::string RdmaConnection::rail_name(int rail) const {
  return shared_.rails.at(static_cast<size_t>(rail)).name;
}

std::vector<int> RdmaConnection::used_rails() const {
  std::vector<int> rails;
  for (const Lane& lane : lanes_) {
    if (std::find(rails.begin(), rails.end(), lane.rail) == rails.end()) rails.push_back(lane.rail);
  }
  return rails;
}

std::vector<int> RdmaConnection::usable_lanes(const std::vector<uint32_t>* keys, int peer_rail,
                                              const MemoryRegion* local) const {
  std::vector<int> out;
  const auto* region = dynamic_cast<const RdmaRegion*>(local);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < lanes_.size(); ++i) {
    const Lane& lane = lanes_[i];
    if (!lane_up_[i]) continue;
    if (region != nullptr && region->lkey_on(static_cast<size_t>(lane.rail)) == 0) continue;
    if (keys == nullptr ? lane.peer_rail != peer_rail
                        : static_cast<size_t>(lane.peer_rail) >= keys->size() ||
                              (*keys)[static_cast<size_t>(lane.peer_rail)] == 0) {
      continue;
    }
    out.push_back(static_cast<int>(i));
  }
  return out;
}

std::shared_ptr<std::vector<uint32_t>> RdmaConnection::remote_keys(
    const Descriptor& remote) const {
  auto keys = std::make_shared<std::vector<uint32_t>>();
  keys->push_back(remote.key);
  keys->insert(keys->end(), remote.rail_keys.begin(), remote.rail_keys.end());
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t c = 0; c < keys->size() && c < peer_generation_.size(); ++c) {
    if (remote.generation < peer_generation_[c]) (*keys)[c] = 0;
  }
  return keys;
}

int RdmaConnection::least_loaded(const std::vector<int>& among) const {
  int best = among.at(0);
  uint64_t best_bytes = ~0ull;
  for (int i : among) {
    const uint64_t b = lanes_[static_cast<size_t>(i)].sq->queued_bytes();
    if (b < best_bytes) {
      best = i;
      best_bytes = b;
    }
  }
  return best;
}

std::vector<double> RdmaConnection::rail_rates(const std::vector<int>& rails) const {
  std::vector<double> rate = meter_.rates();
  double fastest = 0;
  for (int r : rails) fastest = std::max(fastest, rate[static_cast<size_t>(r)]);
  for (int r : rails) {
    double& x = rate[static_cast<size_t>(r)];
    if (x > 0) continue;
    // Not measured yet: as the fastest measured one (so it is measured at once), or, while
    // none is, its port's speed (Mb/s to bytes/s; unknown speeds count as 10 Gb/s alike).
    uint32_t mbps = 0;
    if (fastest == 0) {
      std::lock_guard<std::mutex> lock(mu_);  // a device that comes back rewrites its record
      mbps = shared_.rails[static_cast<size_t>(r)].record.speed_mbps;
    }
    x = fastest > 0 ? fastest : (mbps > 0 ? mbps : 10000) * 125000.0;
  }
  return rate;
}

int RdmaConnection::single_rail(const std::vector<int>& rails,
                                const std::shared_ptr<MemoryRegion>& local,
                                uint64_t length) const {
  const std::vector<double> rate = rail_rates(rails);
  // The local region's home rail (the NIC nearest its memory) while it is live and at least
  // half as fast as the fastest; else the rail whose queue with these bytes drains first.
  const auto* region = dynamic_cast<const RdmaRegion*>(local.get());
  const int home = region != nullptr ? region->home_rail() : -1;
  double fastest = 0;
  for (int r : rails) fastest = std::max(fastest, rate[static_cast<size_t>(r)]);
  if (std::find(rails.begin(), rails.end(), home) != rails.end() &&
      rate[static_cast<size_t>(home)] * 2 >= fastest) {
    return home;
  }
  const std::vector<uint64_t> backlog = meter_.backlogs();
  int best = rails[0];
  double best_s = -1;
  for (int r : rails) {
    const size_t x = static_cast<size_t>(r);
    const double s = static_cast<double>(backlog[x] + length) / rate[x];
    if (best_s < 0 || s < best_s) {
      best = r;
      best_s = s;
    }
  }
  return best;
}

void RdmaConnection::submit(int lane, std::vector<SendWork> works) {
  // Metered before it is posted: its completions may come before submit() returns.
  const size_t rail = static_cast<size_t>(lanes_[static_cast<size_t>(lane)].rail);
  const uint64_t bytes = part_bytes(works);
  meter_.posted(rail, bytes, RailMeter::Clock::now());
  std::vector<SendWork> refused;
  try {
    refused = lanes_[static_cast<size_t>(lane)].sq->submit(std::move(works));
  } catch (const Error& e) {
    abort(ErrorKind::kTransport, std::string("connection to ") + peer() + " aborted: " + e.what());
    return;
  }
  // The lane's rail failed over meanwhile: its chunks go on the live rails (a closed
  // connection's teardown fails their requests instead).
  meter_.unposted(rail, part_bytes(refused));
  if (!refused.empty() && !is_closed()) repost(std::move(refused));
}

RequestPtr RdmaConnection::post_write(const std::shared_ptr<MemoryRegion>& local,
                                      uint64_t local_offset, const Descriptor& remote,
                                      uint64_t remote_offset, uint64_t length,
                                      const TransferOptions& options) {
  return post_one_sided(OpKind::kWrite, local, local_offset, remote, remote_offset, length,
                        options);
}

RequestPtr RdmaConnection::post_read(const std::shared_ptr<MemoryRegion>& local,
                                     uint64_t local_offset, const Descriptor& remote,
                                     uint64_t remote_offset, uint64_t length,
                                     const TransferOptions& options) {
  return post_one_sided(OpKind::kRead, local, local_offset, remote, remote_offset, length,
                        options);
}

RequestPtr RdmaConnection::post_one_sided(OpKind op, const std::shared_ptr<MemoryRegion>& local,
                                          uint64_t local_offset, const Descriptor& remote,
                                          uint64_t remote_offset, uint64_t length,
                                          const TransferOptions& options) {
  const char* what = op == OpKind::kWrite ? "WRITE" : "READ";
  check_local_range(local, local_offset, length, what,
                    op == OpKind::kRead ? LocalUse::kDestination : LocalUse::kSource);
  check_remote(remote, remote_offset, length, what);
  auto req = new_request(op, length);
  count_when_terminal(req, op == OpKind::kRead ? "read" : "write");
  post_chunks(op, req, local, local_offset, remote.addr + remote_offset, remote_keys(remote),
              length, Notified{}, options);
  return req;
}

void RdmaConnection::post_chunks(OpKind op, const RequestPtr& req,
                                 const std::shared_ptr<MemoryRegion>& local,
                                 uint64_t local_offset, uint64_t remote_addr,
                                 std::shared_ptr<const std::vector<uint32_t>> remote_keys,
                                 uint64_t length, const Notified& notified,
                                 const TransferOptions& options) {
  // With an immediate, every chunk goes on one QP paired with the grant's rail so the
  // WRITE_WITH_IMM lands last.
  const bool with_imm = notified.with_imm;
  const uint32_t imm = notified.imm;
  const std::vector<int> usable =
      with_imm ? usable_lanes(nullptr, notified.grant_rail, local.get())
               : usable_lanes(remote_keys.get(), -1, local.get());
  if (usable.empty() && with_imm) {
    throw Error(ErrorKind::kConnection,
                "endpoint to " + peer() + ": the receiver granted this message's buffer on its "
                "rail " + std::to_string(notified.grant_rail) + ", which failed; send it again "
                "(the connection goes on over the other rails)");
  }
  if (usable.empty()) {
    throw Error(ErrorKind::kConnection,
                "endpoint to " + peer() + ": no live rail reaches the remote region (its "
                "descriptor has no key on the peer's remaining rails, or only keys older than "
                "a device of the peer that came back: ask the peer for a new descriptor), or "
                "the local memory has no MR on them (GPU memory registered before a device "
                "came back: register it again); or connect again");
  }
  std::vector<int> rails;  // live rails, in lane order
  for (int l : usable) {
    const int r = lanes_[static_cast<size_t>(l)].rail;
    if (std::find(rails.begin(), rails.end(), r) == rails.end()) rails.push_back(r);
  }
  const bool striped = !with_imm && rails.size() > 1 && length >= kStripeMin;
  if (!striped && rails.size() > 1) rails = {single_rail(rails, local, length)};
  std::vector<std::vector<int>> lanes_of(rails.size());  // per rail in `rails`, its lanes
  for (int l : usable) {
    const auto it = std::find(rails.begin(), rails.end(), lanes_[static_cast<size_t>(l)].rail);
    if (it != rails.end()) lanes_of[static_cast<size_t>(it - rails.begin())].push_back(l);
  }
  size_t n_lanes = 0;
  for (const auto& v : lanes_of) n_lanes += v.size();
  const int available = with_imm ? 1 : static_cast<int>(n_lanes);
  const ChunkPlan plan = plan_chunks(length, available, options, max_chunk());
  // Each rail's bytes (adaptive striping, rail_meter.h), cut into chunks of at most plan.chunk;
  // rail k takes the bytes after rail k-1's.
  std::vector<uint64_t> share = {length};
  if (striped) {
    const std::vector<double> rate = rail_rates(rails);
    std::vector<size_t> meter_rails;
    std::vector<double> rail_rate;
    for (int r : rails) {
      meter_rails.push_back(static_cast<size_t>(r));
      rail_rate.push_back(rate[static_cast<size_t>(r)]);
    }
    share = meter_.shares(length, meter_rails, rail_rate, kShareAlign, RailMeter::Clock::now());
  }
  uint64_t count = 0;
  for (uint64_t s : share) count += (s + plan.chunk - 1) / plan.chunk;
  count = std::max<uint64_t>(count, 1);  // an empty transfer: one empty WR
  req->set_parts(count);
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
    active_[req->id()] = req;
  }
  // Within a rail, round robin over its first plan.streams QPs (at most), starting at the
  // least loaded.
  auto* rdma_region = dynamic_cast<const RdmaRegion*>(local.get());
  std::vector<std::vector<SendWork>> per_lane(lanes_.size());
  uint64_t off = 0;
  uint64_t i = 0;
  for (size_t r = 0; r < rails.size(); ++r) {
    if (share[r] == 0 && !(length == 0 && r == 0)) continue;
    const int spread =
        with_imm ? 1 : std::clamp(plan.streams, 1, static_cast<int>(lanes_of[r].size()));
    const int best = least_loaded(lanes_of[r]);
    const int first = static_cast<int>(std::find(lanes_of[r].begin(), lanes_of[r].end(), best) -
                                       lanes_of[r].begin());
    const uint64_t end = off + share[r];
    for (uint64_t next = 0; next == 0 || off < end; ++next, ++i) {
      const uint64_t n = std::min(plan.chunk, end - off);
      const int pick = (first + static_cast<int>(next % static_cast<uint64_t>(spread))) %
                       static_cast<int>(lanes_of[r].size());
      const int lane = lanes_of[r][static_cast<size_t>(pick)];
      const Lane& l = lanes_[static_cast<size_t>(lane)];
      SendWork w;
      w.opcode = op == OpKind::kRead ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
      if (with_imm && i + 1 == count) {
        w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        w.imm = imm;
      }
      w.local_addr = reinterpret_cast<uint64_t>(local->addr() + local_offset + off);
      w.length = static_cast<uint32_t>(n);
      w.lkey = rdma_region != nullptr ? rdma_region->lkey_on(static_cast<size_t>(l.rail))
                                      : local->lkey();
      w.remote_addr = remote_addr + off;
      w.rkey = with_imm ? (*remote_keys)[0] : (*remote_keys)[static_cast<size_t>(l.peer_rail)];
      w.request = req;
      w.hold = RegionUse(local);
      if (!with_imm) w.remote_keys = remote_keys;
      per_lane[static_cast<size_t>(lane)].push_back(std::move(w));
      off += n;
    }
  }
  for (size_t l = 0; l < per_lane.size(); ++l) {
    if (per_lane[l].empty()) continue;
    per_lane[l].back().last = true;
    submit(static_cast<int>(l), std::move(per_lane[l]));
  }
}

void RdmaConnection::on_qp_event(uint32_t qp_num, const std::string& what) {
  for (const Lane& lane : lanes_) {
    if (lane.qp->qp_num() == qp_num && other_rail_up(lane.rail)) {
      rail_down(lane.rail, what + " on QP " + std::to_string(qp_num));
      return;
    }
  }
  abort(ErrorKind::kConnection, "connection to " + peer() + " aborted: " + what);
}

void RdmaConnection::rail_down(int rail, const std::string& cause) {
  fail_over(rail, -1, cause, true);
}

void RdmaConnection::peer_rail_down(int peer_rail, const std::string& cause) {
  fail_over(-1, peer_rail, "the peer's side of the rail failed: " + cause, false);
}

void RdmaConnection::fail_over(int rail, int peer_rail, const std::string& cause,
                               bool tell_peer) {
  std::vector<size_t> taken;  // the lanes this failure takes out
  std::vector<int> failed;    // local rails left with no live lane
  std::string causes;
  bool lost = false;
  bool moved_ctrl = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kConnected) return;
    for (size_t i = 0; i < lanes_.size(); ++i) {
      if (lane_up_[i] && (lanes_[i].rail == rail || lanes_[i].peer_rail == peer_rail)) {
        lane_up_[i] = false;
        taken.push_back(i);
      }
    }
    if (tell_peer && static_cast<size_t>(rail) < rail_by_peer_.size() &&
        rail_by_peer_[static_cast<size_t>(rail)]) {
      rail_by_peer_[static_cast<size_t>(rail)] = false;  // our own cause says more
      rail_cause_[static_cast<size_t>(rail)] = cause;
    }
    if (taken.empty()) return;  // failed over already
    for (size_t i : taken) schedule_heal_locked(static_cast<size_t>(lanes_[i].rail));
    const std::vector<int> rails = used_rails();
    for (int x : rails) {
      const size_t r = static_cast<size_t>(x);
      bool live = false;
      for (size_t i = 0; i < lanes_.size(); ++i) {
        live = live || (lanes_[i].rail == x && lane_up_[i]);
      }
      if (rail_up_[r] && !live) {
        rail_up_[r] = false;
        rail_cause_[r] = cause;
        rail_by_peer_[r] = peer_rail >= 0;
        failed.push_back(x);
      }
      if (!rail_up_[r]) {
        causes += (causes.empty() ? "" : "; ") + rail_name(x) + ": " + rail_cause_[r];
      }
    }
    lost = std::find(lane_up_.begin(), lane_up_.end(), true) == lane_up_.end();
    const int from = ctrl_lane_.load();
    if (!lost && !lane_up_[static_cast<size_t>(from)]) {
      // The control lane moves: to the first live lane after it, else the first live one.
      int to = -1;
      for (size_t i = 0; i < lanes_.size(); ++i) {
        if (!lane_up_[i]) continue;
        if (to < 0 || (to < from && static_cast<int>(i) > from)) to = static_cast<int>(i);
      }
      ctrl_lane_.store(to);
      moved_ctrl = true;
    }
  }
  if (lost) {
    abort(ErrorKind::kConnection,
          "connection to " + peer() + " lost every rail: " + causes);
    return;
  }
  if (moved_ctrl) {
    // The bootstrap socket's watch stays where it is (a rail whose port is down still has its
    // completion thread; release_rail moves the watch when the device goes).
    log::write(log::Level::kWarning, "rdma endpoint to " + peer() + ": the control lane failed (" +
                                         cause + "); control messages move to " +
                                         rail_name(ctrl_rail()));
  }
  std::vector<SendWork> orphans;
  for (size_t i : taken) {
    lanes_[i].qp->to_error();
    std::vector<SendWork> moved = lanes_[i].sq->take_works();
    meter_.unposted(static_cast<size_t>(lanes_[i].rail), part_bytes(moved));
    for (auto& w : moved) orphans.push_back(std::move(w));
  }
  if (log::enabled(log::Level::kWarning)) {
    std::string which;
    for (int x : failed) which += (which.empty() ? "" : "+") + rail_name(x);
    log::write(log::Level::kWarning,
               "rdma endpoint to " + peer() + ": " + std::to_string(taken.size()) +
                   " QP(s) failed" + (which.empty() ? "" : ", rail " + which) + " (" + cause +
                   "); " + std::to_string(orphans.size()) +
                   " outstanding chunk(s) move to the remaining rails");
  }
  if (tell_peer) {
    // The peer's end of the rail may stay up (a deleted device sends nothing; a QP in error
    // only shows there when a WR of the peer's fails): its WRs there would wait for the
    // retries to run out. It is told on the control lane, which is live.
    CtrlMessage m;
    m.type = kCtrlRailDown;
    m.addr = static_cast<uint64_t>(rail);
    m.meta = cause.substr(0, std::min<size_t>(cause.size(), kRailDownCauseMax));
    send_ctrl(m, {});
  }
  repost(std::move(orphans));
}

void RdmaConnection::release_rail(int rail, const std::string& cause) {
  const size_t r = static_cast<size_t>(rail);
  Rail dropped;  // this rail's handles, let go of outside the locks
  std::shared_ptr<CompletionQueue> cq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r >= rail_released_.size() || rail_released_[r]) return;
    rail_released_[r] = true;
    if (rail_up_[r] || rail_by_peer_[r] || rail_cause_[r].empty()) rail_cause_[r] = cause;
    rail_by_peer_[r] = false;
    rail_up_[r] = false;
    for (size_t i = 0; i < lanes_.size(); ++i) {
      if (lanes_[i].rail != rail) continue;
      lane_up_[i] = false;  // a closed one's drain no longer waits
      healing_[i] = false;
    }
    heals_[r].never = "its device was removed";
    dropped = shared_.rails[r].take_handles();
    cq = std::move(shared_.cqs[r]);
  }
  {
    // Against connect_qps on a handshake thread: the QPs are destroyed before it or after it.
    std::lock_guard<std::mutex> setup(setup_mu_);
    for (size_t i = 0; i < lanes_.size(); ++i) {
      Lane& lane = lanes_[i];
      if (lane.rail != rail) continue;
      lane.qp->to_error();
      // rail_down moved an open connection's chunks already; a closed one's requests failed.
      if (lane.sq) lane.sq->take_works();
      lane.qp->destroy();  // no DMA from here on: the buffers' MRs can go
      lane.send_slab->release_mr();
      if (lane.recv_slab) lane.recv_slab->release_mr();
      posted_recvs_[i].store(0);
    }
  }
  {
    // The bootstrap socket moves to a live rail's completion thread (none: nobody watches it
    // any more, and the connection is closed or about to be).
    std::lock_guard<std::mutex> lock(socket_mu_);
    if (socket_poller_ && socket_poller_ == dropped.poller) {
      socket_poller_->unwatch_socket(socket_.get());
      socket_poller_.reset();
      for (int other : used_rails()) {
        if (auto p = poller_of(other); p && socket_.valid()) {
          p->watch_socket(socket_.get(), tag_);
          socket_poller_ = std::move(p);
          break;
        }
      }
    }
  }
  if (log::enabled(log::Level::kInfo)) {
    log::write(log::Level::kInfo, "rdma endpoint to " + peer() + ": released rail " +
                                      rail_name(rail) + " (" + cause + ")");
  }
}

void RdmaConnection::follow_ctrl_lane(int lane) {
  int cur = ctrl_lane_.load();
  // Only a later lane on another rail means a move (WRITE_WITH_IMM may come on any QP of the
  // control rail).
  while (lane > cur && lanes_[static_cast<size_t>(lane)].rail != lanes_[static_cast<size_t>(cur)].rail) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!lane_up_[static_cast<size_t>(lane)]) return;
    }
    if (ctrl_lane_.compare_exchange_weak(cur, lane)) {
      const int old_rail = lanes_[static_cast<size_t>(cur)].rail;
      log::write(log::Level::kInfo, "rdma endpoint to " + peer() +
                                        ": the peer moved its control lane; ours follows to " +
                                        rail_name(lanes_[static_cast<size_t>(lane)].rail));
      // No-op when our side of the rail failed already (a port down on both ends); the peer's
      // RAIL_DOWN may still be on its way (it follows the move).
      fail_over(old_rail, -1,
                "the peer moved its control lane off it: its side of the rail failed "
                "(e.g. its device was removed)",
                false);
      return;
    }
  }
}

std::string RdmaConnection::port_not_active(int rail) const {
  std::shared_ptr<DeviceContext> context;
  {
    std::lock_guard<std::mutex> lock(mu_);
    context = shared_.rails.at(static_cast<size_t>(rail)).context;
  }
  return context ? context->port_not_active() : std::string();
}

bool RdmaConnection::other_rail_up(int rail) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (lanes_[i].rail != rail && lane_up_[i]) return true;
  }
  return false;
}

void RdmaConnection::repost(std::vector<SendWork> works) {
  std::vector<std::vector<SendWork>> per_lane(lanes_.size());
  for (SendWork& w : works) {
    if (w.request && w.request->done()) continue;  // failed meanwhile
    if (w.opcode == IBV_WR_SEND) {  // a control SEND: on the (new) control lane
      per_lane[static_cast<size_t>(ctrl_lane())].push_back(std::move(w));
      continue;
    }
    if (!w.remote_keys) {
      // A notified WRITE's chunk: bound to the grant's rkey, on the peer's old control rail.
      if (w.request) {
        w.request->fail(Error(ErrorKind::kConnection,
                              "connection to " + peer() + ": a notified WRITE was in flight on "
                              "the control rail when it failed; its grant is bound to that rail "
                              "(send it again: the connection goes on over the other rails)"));
      }
      continue;
    }
    const std::vector<int> usable = usable_lanes(w.remote_keys.get(), -1, w.hold.get());
    if (usable.empty()) {
      abort(ErrorKind::kConnection,
            "connection to " + peer() + ": a failed rail's chunk has no live rail to move to");
      return;
    }
    const int lane = least_loaded(usable);
    const Lane& l = lanes_[static_cast<size_t>(lane)];
    const auto* region = dynamic_cast<const RdmaRegion*>(w.hold.get());
    w.lkey = region != nullptr ? region->lkey_on(static_cast<size_t>(l.rail)) : w.hold.get()->lkey();
    w.rkey = (*w.remote_keys)[static_cast<size_t>(l.peer_rail)];
    w.last = true;  // signaled: its part completes on its own
    per_lane[static_cast<size_t>(lane)].push_back(std::move(w));
  }
  for (size_t l = 0; l < per_lane.size(); ++l) {
    if (!per_lane[l].empty()) submit(static_cast<int>(l), std::move(per_lane[l]));
  }
}

}  // namespace rdmaxfer
