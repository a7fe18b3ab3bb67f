// RdmaConnection: set-up, state and teardown. Its completions are in rdma_completions.cc, the
// protocol's primitives (control SENDs, grants, WRITE_WITH_IMM) in rdma_messages.cc, the placement
// of one-sided chunks on the rails and failover in rdma_striping.cc.
#include "transport/rdma/rdma_connection.h"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "common/test_hooks.h"

namespace rdmaxfer {

namespace {
constexpr uint8_t kGoodbyeByte = 'G';
// How long close() and the destructor wait for the flush completions after QPs go to ERR.
constexpr double kDrainTimeoutS = 5.0;

// The rail of this engine test_hooks::rdma_qp_error() names, or -1, and its bytes.
std::pair<int, uint64_t> test_qp_error(const std::vector<Rail>& rails) {
  const auto [device, bytes] = test_hooks::rdma_qp_error();
  if (device.empty()) return {-1, 0};
  for (size_t r = 0; r < rails.size(); ++r) {
    if (rails[r].name == device) return {static_cast<int>(r), bytes};
  }
  return {-1, 0};  // not a rail of this engine (the other side's knob)
}
}  // namespace

RdmaConnection::RdmaConnection(Transport& transport, const RdmaConnSettings& settings,
                               RdmaShared shared, uint32_t tag, const std::vector<LaneSpec>& lanes)
    : Channel(transport.stats()),
      transport_(transport),
      settings_(settings),
      shared_(std::move(shared)),
      tag_(tag),
      meter_(shared_.rails.size()) {
  const size_t n_rails = shared_.rails.size();
  rail_up_.assign(n_rails, true);
  rail_released_.assign(n_rails, false);
  rail_cause_.assign(n_rails, "");
  rail_by_peer_.assign(n_rails, false);
  rail_bytes_ = std::make_unique<std::atomic<uint64_t>[]>(n_rails);
  lanes_.resize(lanes.size());
  posted_recvs_ = std::make_unique<std::atomic<int>[]>(lanes.size());
  lane_up_.assign(lanes.size(), true);
  healing_.assign(lanes.size(), false);
  heals_.resize(n_rails);
  std::tie(test_err_rail_, test_err_bytes_) = test_qp_error(shared_.rails);
  test_ctrl_twice_ = test_hooks::rdma_ctrl_twice();
  for (size_t i = 0; i < lanes.size(); ++i) {
    Lane& lane = lanes_[i];
    const Rail& rail = shared_.rails.at(static_cast<size_t>(lanes[i].rail));
    lane.rail = lanes[i].rail;
    lane.peer_rail = lanes[i].peer_rail;
    if (!rail.srq) {  // no SRQ on this rail: the QP's own receive buffers
      lane.recv_slab =
          std::make_unique<BufferSlab>(rail.pd, settings_.ctrl_size, settings_.ctrl_depth);
    }
    lane.send_slab =
        std::make_unique<BufferSlab>(rail.pd, settings_.ctrl_size, settings_.ctrl_slots);
    lane.qp = std::make_unique<QueuePair>(rail.pd,
                                          shared_.cqs.at(static_cast<size_t>(lane.rail)),
                                          settings_.limits, tag_, rail.srq);
    lane.qp->to_init();
  }
}

RdmaConnection::~RdmaConnection() {
  abort(ErrorKind::kClosed, "the endpoint was destroyed");
  // Dropped without close(): no wait here (the last owner may hold locks the completion path
  // needs). ibv_destroy_qp of the QPs, in ERR, ends all DMA first; then the buffers, and the
  // MRs and regions kept for the drain, go.
  lanes_.clear();
}

EndpointRecord RdmaConnection::local_record() const {
  EndpointRecord r;
  for (const Rail& rail : shared_.rails) r.rails.push_back(rail.record);
  r.max_message = static_cast<uint32_t>(std::min<uint64_t>(settings_.max_message, 0xffffffffu));
  r.ctrl_size = settings_.ctrl_size;
  r.ctrl_depth = settings_.ctrl_depth;
  r.responder_resources = settings_.limits.responder_resources;
  r.initiator_depth = settings_.limits.initiator_depth;
  r.engine_id = transport_.engine_id();
  for (const Lane& lane : lanes_) {
    r.qps.push_back({lane.qp->qp_num(), lane.qp->psn(), static_cast<uint8_t>(lane.rail),
                     static_cast<uint8_t>(lane.peer_rail)});
  }
  return r;
}

void RdmaConnection::connect_qps(const EndpointRecord& peer, bool acceptor) {
  std::lock_guard<std::mutex> setup(setup_mu_);
  if (peer.qps.empty()) throw Error(ErrorKind::kConnection, no_rail_pair(shared_.rails, peer));
  if (peer.ctrl_size < CtrlHeader::kSize) {
    throw Error(ErrorKind::kProtocol, "the peer's control buffers (" +
                                          std::to_string(peer.ctrl_size) + " bytes) are too small");
  }
  // QPs pair within groups named by the connector's rail: the k-th of ours in a group with the
  // k-th of the peer's in the same group.
  auto group_of_mine = [acceptor](const Lane& l) { return acceptor ? l.peer_rail : l.rail; };
  auto group_of_peer = [acceptor](const EndpointRecord::Qp& q) {
    return acceptor ? static_cast<int>(q.rail) : static_cast<int>(q.peer_rail);
  };
  std::vector<Lane> paired;
  std::vector<const EndpointRecord::Qp*> peer_qps;
  std::vector<size_t> used(peer.qps.size(), 0);
  for (Lane& lane : lanes_) {
    const EndpointRecord::Qp* match = nullptr;
    for (size_t j = 0; j < peer.qps.size() && match == nullptr; ++j) {
      if (used[j] == 0 && group_of_peer(peer.qps[j]) == group_of_mine(lane)) {
        used[j] = 1;
        match = &peer.qps[j];
      }
    }
    if (match == nullptr) {
      if (acceptor) {
        throw Error(ErrorKind::kProtocol, "the peer offers no QP to pair with ours on " +
                                              rail_name(lane.rail));
      }
      continue;  // a rail of ours that no rail of the acceptor reaches: its QP goes
    }
    lane.peer_rail = match->rail;
    paired.push_back(std::move(lane));
    peer_qps.push_back(match);
  }
  // The acceptor leaves the connector's unreachable rails unpaired; the connector pairs all the
  // acceptor offers.
  if (paired.empty() || (!acceptor && std::find(used.begin(), used.end(), 0) != used.end())) {
    throw Error(ErrorKind::kConnection,
                "no rail pair: the peer's QPs do not match ours (" +
                    std::to_string(peer.qps.size()) + " offered, " +
                    std::to_string(paired.size()) + " paired)");
  }
  lanes_ = std::move(paired);
  posted_recvs_ = std::make_unique<std::atomic<int>[]>(lanes_.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    lane_up_.assign(lanes_.size(), true);
    healing_.assign(lanes_.size(), false);
    acceptor_ = acceptor;
  }
  const QpLimits& own = settings_.limits;
  negotiated_.max_rd_atomic =
      std::max<uint8_t>(1, std::min(own.initiator_depth, peer.responder_resources));
  negotiated_.max_dest_rd_atomic =
      std::max<uint8_t>(1, std::min(own.responder_resources, peer.initiator_depth));
  negotiated_.path_mtu = 0;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = lanes_[i];
    const Rail& rail = shared_.rails.at(static_cast<size_t>(lane.rail));
    const EndpointRecord::Rail& theirs = peer.rails.at(static_cast<size_t>(lane.peer_rail));
    if (!rails_reach(rail.record, theirs)) {
      throw Error(ErrorKind::kConnection,
                  "the peer paired " + rail_text(rail.name, rail.record) +
                      " with its rail " + std::to_string(lane.peer_rail) +
                      " on another link layer or network; both ends must share a fabric");
    }
    lane.sq = std::make_unique<SendQueue>(*lane.qp, wr_prefix(tag_, static_cast<int>(i), false),
                                          *lane.send_slab,
                                          std::max<uint32_t>(1, settings_.limits.sq_depth / 4));
    if (lane.recv_slab) {
      for (uint32_t s = 0; s < settings_.ctrl_depth; ++s) post_recv_slot(static_cast<int>(i), s);
    }
    const auto mtu = static_cast<ibv_mtu>(
        std::min<int>(theirs.active_mtu, static_cast<int>(rail.record.active_mtu)));
    const int bytes = mtu_bytes(mtu);
    negotiated_.path_mtu = negotiated_.path_mtu == 0 ? bytes : std::min(negotiated_.path_mtu, bytes);
    QpAddress addr;
    addr.qpn = peer_qps[i]->qpn;
    addr.psn = peer_qps[i]->psn;
    addr.lid = theirs.lid;
    std::memcpy(addr.gid.raw, theirs.gid, 16);
    lane.qp->to_rtr(addr, mtu, negotiated_.max_dest_rd_atomic);
    lane.qp->to_rts(negotiated_.max_rd_atomic);
    lane.peer = addr;
    lane.mtu = mtu;
  }
  uint64_t peer_max = peer.max_message == 0 ? settings_.max_message : peer.max_message;
  max_chunk_ = std::min<uint64_t>({settings_.max_message, peer_max, 1ull << 30});
  peer_ctrl_size_ = peer.ctrl_size;
  std::lock_guard<std::mutex> lock(mu_);
  window_ = std::max<uint32_t>(1, peer.ctrl_depth / 4);
  peer_generation_.clear();
  for (const EndpointRecord::Rail& rail : peer.rails) peer_generation_.push_back(rail.generation);
  state_ = State::kConnected;
}

void RdmaConnection::start(UniqueFd socket, std::unique_ptr<TlsSession> tls, std::string peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer_ = std::move(peer);
  }
  std::lock_guard<std::mutex> lock(socket_mu_);
  socket_ = std::move(socket);
  socket_tls_ = std::move(tls);
  socket_poller_ = poller_of(ctrl_rail());
  socket_poller_->watch_socket(socket_.get(), tag_);
}

std::shared_ptr<CqPoller> RdmaConnection::poller_of(int rail) const {
  std::lock_guard<std::mutex> lock(mu_);
  return shared_.rails.at(static_cast<size_t>(rail)).poller;
}

RdmaConnection::State RdmaConnection::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

std::string RdmaConnection::peer() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peer_;
}

std::string RdmaConnection::describe() const {
  const std::vector<int> rails = used_rails();
  std::string names;
  for (int r : rails) names += (names.empty() ? "" : "+") + rail_name(r);
  std::string s = "rdma to " + peer() + ", " + std::to_string(streams()) + " RC QP(s) on " + names +
                  ", control rail " + rail_name(ctrl_rail());
  const std::vector<double> rates = meter_.rates();
  const std::vector<uint32_t> share = meter_.last_share_pct();
  {
    std::lock_guard<std::mutex> lock(mu_);
    s += ", rails:";
    for (int r : rails) {
      const size_t i = static_cast<size_t>(r);
      const std::string rejoined =
          heals_[i].rejoins > 0 ? " (rejoined " + std::to_string(heals_[i].rejoins) +
                                      "x, last failure: " + rail_cause_[i] + ")"
                                : "";
      const std::string state = rail_up_[i]         ? "up" + rejoined
                                : rail_released_[i] ? "removed (" + rail_cause_[i] + ")"
                                                    : "failed (" + rail_cause_[i] + ")";
      s += " " + rail_name(r) + " " + state + " " + std::to_string(rail_bytes_[i].load()) +
           " bytes, " + rate_text(rates[i]) + ", " + std::to_string(share[i]) +
           "% of the last striped transfer;";
    }
  }
  for (const auto& [name, value] : attributes()) s += ", " + name + " " + std::to_string(value);
  return s;
}

std::vector<std::pair<std::string, uint64_t>> RdmaConnection::attributes() const {
  std::vector<std::pair<std::string, uint64_t>> rails;
  const std::vector<double> rates = meter_.rates();
  const std::vector<uint32_t> share = meter_.last_share_pct();
  const std::vector<int> used = used_rails();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int r : used) {
      const std::string key = "rail_" + rail_name(r);
      const size_t i = static_cast<size_t>(r);
      rails.emplace_back(key + "_bytes", rail_bytes_[i].load());
      rails.emplace_back(key + "_up", rail_up_[i] ? 1 : 0);
      rails.emplace_back(key + "_removed", rail_released_[i] ? 1 : 0);
      rails.emplace_back(key + "_rate", static_cast<uint64_t>(rates[i]));
      rails.emplace_back(key + "_share_pct", share[i]);
      rails.emplace_back(key + "_rejoins", heals_[i].rejoins);
    }
  }
  // The first QP not destroyed with its device (the control QP unless its rail was removed).
  const Lane* first = nullptr;
  for (const Lane& lane : lanes_) {
    if (first == nullptr && !lane.qp->destroyed()) first = &lane;
  }
  std::vector<std::pair<std::string, uint64_t>> out = {
      {"path_mtu", negotiated_.path_mtu},
      {"max_rd_atomic", negotiated_.max_rd_atomic},
      {"max_dest_rd_atomic", negotiated_.max_dest_rd_atomic},
      {"max_inline", first == nullptr ? 0 : first->qp->limits().max_inline},
      {"rnr_retry", kRnrRetries},
      {"outstanding_wrs", outstanding_wrs()},
      {"posted_receives", posted_receives()},
      {"ctrl_repeats", ctrl_repeats_.load()},
      {"rails", used.size()}};
  // The SRQs of the rails this connection uses (shared by every connection on them).
  const bool all_srq = !lanes_.empty() && std::all_of(lanes_.begin(), lanes_.end(),
                                                      [](const Lane& l) { return l.qp->on_srq(); });
  uint64_t srq_posted = 0;
  uint64_t srq_buffers = 0;
  uint64_t srq_grows = 0;
  std::vector<std::shared_ptr<SharedReceiveQueue>> srqs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int r : used_rails()) srqs.push_back(shared_.rails[static_cast<size_t>(r)].srq);
  }
  for (const auto& srq : srqs) {
    if (srq) {
      srq_posted += srq->posted();
      srq_buffers += srq->buffers();
      srq_grows += srq->grows();
    }
  }
  out.insert(out.end(), {{"srq", all_srq ? 1u : 0u},
                         {"srq_posted", srq_posted},
                         {"srq_buffers", srq_buffers},
                         {"srq_grows", srq_grows}});
  out.insert(out.end(), rails.begin(), rails.end());
  if (first != nullptr) {
    // What the first QP holds (ibv_query_qp), and what ibv_modify_qp was given (every rail's
    // QPs get the same settings): on RoCE the traffic class (the IP TOS byte) is what the packets carry, and
    // rxe reads back no SL.
    const FabricSettings f = first->qp->query_fabric();
    const FabricSettings& applied = first->qp->applied_fabric();
    const bool roce = shared_.rails.at(static_cast<size_t>(first->rail)).record.link_layer ==
                      EndpointRecord::kLinkEthernet;
    out.insert(out.end(), {{"service_level", f.service_level},
                           {"traffic_class", f.traffic_class},
                           {"min_rnr_timer", f.min_rnr_timer},
                           {"applied_service_level", applied.service_level},
                           {"applied_traffic_class", applied.traffic_class},
                           {"applied_min_rnr_timer", applied.min_rnr_timer},
                           {"roce", roce ? 1u : 0u}});
  }
  return out;
}

RequestPtr RdmaConnection::new_request(OpKind op, uint64_t bytes) {
  auto req = std::make_shared<Request>(transport_.next_request_id(), op, bytes);
  req->set_progress(poller_of(ctrl_rail()));
  return req;
}

void RdmaConnection::check_open_locked() const {
  if (state_ == State::kClosed) {
    throw Error(error_kind_ == ErrorKind::kClosed ? ErrorKind::kClosed : ErrorKind::kConnection,
                "endpoint to " + peer_ + " is closed: " + error_ +
                    "; connect again to open a new endpoint");
  }
  if (state_ != State::kConnected) {
    throw Error(ErrorKind::kInvalidArgument, "the endpoint is not connected yet");
  }
}

void RdmaConnection::check_remote(const Descriptor& remote, uint64_t remote_offset,
                                  uint64_t length, const char* what) const {
  if (remote.transport != transport_.capabilities().wire_id) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + ": the descriptor comes from a " +
                    transport_id_name(remote.transport) +
                    " engine; one-sided RDMA needs a descriptor from an rdma engine");
  }
  check_remote_range(remote, remote_offset, length, what);
  check_peer_engine(remote, what);
}

uint64_t RdmaConnection::max_chunk() const { return max_chunk_; }

void RdmaConnection::on_socket_ready() {
  uint8_t buf[64];
  ssize_t n = 0;
  int err = 0;
  try {
    std::lock_guard<std::mutex> lock(socket_mu_);
    if (!socket_.valid()) return;  // closed meanwhile
    // Under TLS a record may hold more than one read takes (none is visible to epoll then):
    // read until the session has nothing left or the GOODBYE is seen.
    do {
      n = socket_tls_ ? socket_tls_->read(buf, sizeof(buf))
                      : recv(socket_.get(), buf, sizeof(buf), MSG_DONTWAIT);
      err = errno;
    } while (n > 0 && std::memchr(buf, kGoodbyeByte, static_cast<size_t>(n)) == nullptr &&
             socket_tls_ && socket_tls_->pending());
  } catch (const Error& e) {  // a TLS record that fails authentication
    abort(ErrorKind::kConnection, "bootstrap connection to " + peer() + ": " + e.what());
    return;
  }
  errno = err;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n > 0 && std::memchr(buf, kGoodbyeByte, static_cast<size_t>(n)) != nullptr) {
    const Error bye(ErrorKind::kConnection, "peer " + peer() + " closed the endpoint");
    teardown(bye, nullptr, bye, log::Level::kInfo);
  } else if (n == 0) {
    abort(ErrorKind::kConnection,
          "peer " + peer() + " went away (its bootstrap connection closed: the process exited "
                             "or closed the endpoint)");
  } else if (n < 0) {
    abort(ErrorKind::kConnection, errno_text("bootstrap connection to " + peer(), errno));
  }
  // Other bytes are not part of the protocol; ignore them.
}

bool RdmaConnection::drained() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (!lane_up_[i]) continue;  // failed over: nothing kept
    if ((lanes_[i].sq && !lanes_[i].sq->idle()) || posted_recvs_[i].load() > 0) return false;
  }
  return true;
}

bool RdmaConnection::release_if_drained() {
  if (!drained()) return false;
  std::vector<std::unique_ptr<VerbsMr>> mrs;
  std::vector<RegionUse> holds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mrs = std::move(draining_mrs_);
    holds = std::move(draining_holds_);
  }
  mrs.clear();  // nothing is on the device any more: the MRs and regions can go
  holds.clear();
  std::lock_guard<std::mutex> lock(drain_mu_);
  drain_cv_.notify_all();
  return true;
}

void RdmaConnection::wait_drained(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  const auto torn_down = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    return torn_down_;
  };
  // A teardown begun by another thread (an error completion, the peer's GOODBYE) may still be
  // failing its requests after the flushes drained: wait for both. The pollers are taken anew
  // each round: a rail's may be released meanwhile (its device removed).
  const auto pollers = [this] {
    std::vector<std::shared_ptr<CqPoller>> out;
    std::lock_guard<std::mutex> lock(mu_);
    for (const Rail& rail : shared_.rails) {
      if (rail.poller) out.push_back(rail.poller);
    }
    return out;
  };
  const auto running = [](const std::vector<std::shared_ptr<CqPoller>>& ps) {
    return std::any_of(ps.begin(), ps.end(), [](const auto& p) { return p->running(); });
  };
  while (!(torn_down() && release_if_drained()) && running(pollers()) &&
         std::chrono::steady_clock::now() < deadline) {
    bool progressed = false;
    for (const auto& poller : pollers()) progressed = poller->progress() || progressed;
    if (progressed) continue;
    std::unique_lock<std::mutex> lock(drain_mu_);
    drain_cv_.wait_for(lock, std::chrono::milliseconds(2));
  }
}

void RdmaConnection::close() {
  begin_close();
  // Closed here, by the peer or by an error: return once the flushes are drained.
  if (!CqPoller::dispatching()) wait_drained(kDrainTimeoutS);
}

void RdmaConnection::begin_close() {
  bool open = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    open = state_ != State::kClosed;
  }
  if (open) {
    {
      std::lock_guard<std::mutex> lock(socket_mu_);
      if (socket_.valid()) {
        const uint8_t bye = kGoodbyeByte;
        try {
          iovec iov{const_cast<uint8_t*>(&bye), 1};
          if ((socket_tls_ ? socket_tls_->writev(&iov, 1)
                           : send(socket_.get(), &bye, 1, MSG_DONTWAIT | MSG_NOSIGNAL)) < 0) {
            // Best effort: the peer notices the EOF instead.
          }
        } catch (const Error&) {
          // The same: a TLS error on a stream already broken.
        }
      }
    }
    abort(ErrorKind::kClosed, "closed locally");
  }
}

void RdmaConnection::abort(ErrorKind kind, const std::string& reason) {
  teardown(Error(kind, reason), nullptr, Error(kind, reason), connection_end_level(kind));
}

void RdmaConnection::teardown(const Error& why, const RequestPtr& culprit,
                              const Error& culprit_error, log::Level level,
                              const std::function<void()>& settle) {
  const ErrorKind kind = why.kind();
  const std::string reason = why.what();
  std::vector<RequestPtr> failed;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (state_ == State::kClosed) {
      lock.unlock();
      if (settle) {
        settle();
      } else if (culprit) {
        culprit->fail(culprit_error);
      }
      return;
    }
    state_ = State::kClosed;
    error_kind_ = kind;
    error_ = reason;
    for (auto& [id, r] : active_) failed.push_back(r);
    for (auto& [id, g] : grants_) {
      // The peer's WRITE into a grant may still be landing: keep its MR and region until
      // drained.
      if (g.temp_mr) draining_mrs_.push_back(std::move(g.temp_mr));
      draining_holds_.push_back(std::move(g.hold));
    }
    active_.clear();
    gathers_.clear();
    grants_.clear();
  }
  // No more DMA: the QPs flush their WRs and receives; on_completion retires the flushes and
  // the last one releases the MRs and regions they used (release_if_drained).
  for (Lane& lane : lanes_) {
    if (lane.qp) lane.qp->to_error();
  }
  for (Lane& lane : lanes_) {
    if (lane.sq) {
      for (auto& r : lane.sq->take_all()) failed.push_back(r);
    }
  }
  {
    // Closing the socket (not only shutting it down) frees the descriptor now; the peer sees
    // EOF. The queued GOODBYE byte, if any, still goes out before the FIN.
    std::lock_guard<std::mutex> lock(socket_mu_);
    if (socket_.valid()) {
      if (socket_poller_) socket_poller_->unwatch_socket(socket_.get());
      ::shutdown(socket_.get(), SHUT_WR);
      socket_tls_.reset();
      socket_.reset();
    }
    socket_poller_.reset();
  }
  if (level >= log::Level::kWarning) stats_->add_error("connection");
  if (log::enabled(level)) {
    log::write(level, "rdma endpoint to " + peer() + " closed (" + error_kind_name(kind) +
                          "): " + reason + "; " + std::to_string(failed.size()) +
                          " pending operation(s) failed");
  }
  if (settle) {
    settle();  // first: its own outcome wins
  } else if (culprit) {
    culprit->fail(culprit_error);
  }
  for (auto& r : failed) r->fail(why);
  if (events()) events()->on_closed(why);  // the protocol's messages, headers and receives
  {
    std::lock_guard<std::mutex> lock(mu_);
    torn_down_ = true;
  }
  release_if_drained();  // nothing was in flight; wakes a close() waiting for this teardown
  // ibv_destroy_qp and the buffers go when the last owner drops the connection.
}

bool RdmaConnection::is_closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kClosed;
}

std::string RdmaConnection::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

}  // namespace rdmaxfer
