// RdmaTransport: its rails, regions, connections (listen, accept, connect, the handshake) and
// shutdown. Completions and events are dispatched in rdma_events.cc, device removal in
// rdma_removal.cc.
#include "transport/rdma/rdma_transport.h"

#include <algorithm>
#include <cstdlib>

#include "common/error.h"
#include "common/interrupt.h"
#include "common/log.h"
#include "common/random.h"
#include "core/poll_mode.h"
#include "transport/rdma/fabric_settings.h"
#include "transport/rdma/rdma_rails.h"
#include "transport/socket.h"

namespace rdmaxfer {

namespace {
constexpr int kMaxCqe = 16384;
// Each rail's SRQ: 256 receive buffers at first (env RDMAXFER_SRQ_BUFFERS), grown as many at a
// time up to 8192 (of ctrl_size, 16 KiB: 4 MiB at first, at most 128 MiB), whatever the number
// of peers.
constexpr uint32_t kSrqChunk = 256;
constexpr uint32_t kSrqCap = 8192;

uint32_t srq_chunk() {
  const char* env = std::getenv("RDMAXFER_SRQ_BUFFERS");
  if (env == nullptr || *env == '\0') return kSrqChunk;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  if (end == env || *end != '\0' || v < 1 || v > static_cast<long>(kSrqCap)) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string("RDMAXFER_SRQ_BUFFERS=") + env + " is not an integer in 1.." +
                    std::to_string(kSrqCap) + " (receive buffers each SRQ starts with and adds " +
                    "per step; unset it for " + std::to_string(kSrqChunk) + ")");
  }
  return static_cast<uint32_t>(v);
}
constexpr double kAcceptHandshakeS = 10.0;

}  // namespace

RdmaTransport::RdmaTransport(uint64_t engine_id, const RdmaConfig& config)
    : Transport(engine_id), config_(config) {
  // Adaptive is event here (and named so): the completion thread sleeps on the channel, and a
  // waiting caller polls the CQ itself for a while first (Request::wait_for) in either mode.
  busy_poll_ = parse_poll_mode(config_.poll_mode) == PollMode::kBusy;
  config_.poll_mode = busy_poll_ ? "busy" : "event";
  if (config_.default_qps <= 0) config_.default_qps = 1;
  if (config_.tls) tls_ = std::make_shared<const TlsContext>(config_.tls_settings);
  if (config_.default_qps > EndpointRecord::kMaxQps) {
    throw Error(ErrorKind::kInvalidArgument,
                "streams=" + std::to_string(config_.default_qps) + " exceeds " +
                    std::to_string(EndpointRecord::kMaxQps) + " QPs per connection");
  }
  settings_.limits.fabric = resolve_fabric_settings(config_);
  for (const std::string& name : rail_devices(config_)) {
    Rail rail;
    rail.context = DeviceContext::open(name, config_.port, config_.gid_index);
    rail.name = rail.context->name();
    rail.record = rail_record(*rail.context);
    rails_.push_back(std::move(rail));
  }
  const ibv_device_attr& dev = rails_[0].context->device_attr();
  settings_.eager_limit = config_.eager_limit > 0 ? config_.eager_limit : 8192;
  if (settings_.eager_limit > settings_.ctrl_size - CtrlHeader::kSize - 1024) {
    throw Error(ErrorKind::kInvalidArgument,
                "eager_limit=" + std::to_string(settings_.eager_limit) + " exceeds " +
                    std::to_string(settings_.ctrl_size - CtrlHeader::kSize - 1024) +
                    " bytes on rdma");
  }
  // Every rail's QPs use the same limits: the smallest of the devices'.
  int max_wr = dev.max_qp_wr;
  int init_rd = dev.max_qp_init_rd_atom;
  int rd = dev.max_qp_rd_atom;
  int max_cqe = dev.max_cqe;
  settings_.max_message = 1ull << 30;
  for (const Rail& rail : rails_) {
    const ibv_device_attr& a = rail.context->device_attr();
    max_wr = std::min(max_wr, a.max_qp_wr);
    init_rd = std::min(init_rd, a.max_qp_init_rd_atom);
    rd = std::min(rd, a.max_qp_rd_atom);
    max_cqe = std::min(max_cqe, a.max_cqe);
    const uint64_t msg = rail.context->port_attr().max_msg_sz;
    if (msg > 0) settings_.max_message = std::min<uint64_t>(settings_.max_message, msg);
  }
  max_wr = std::max(16, max_wr);
  settings_.limits.sq_depth = static_cast<uint32_t>(
      std::min(max_wr, config_.sq_depth > 0 ? config_.sq_depth : 256));
  settings_.limits.rq_depth = settings_.ctrl_depth;
  settings_.limits.initiator_depth = static_cast<uint8_t>(std::clamp(init_rd, 1, 16));
  settings_.limits.responder_resources = static_cast<uint8_t>(std::clamp(rd, 1, 16));
  max_cqe_ = std::min(kMaxCqe, max_cqe);
  for (size_t i = 0; i < rails_.size(); ++i) {
    open_handles(rails_[i], static_cast<int>(i));
    pds_.push_back(rails_[i].pd);
  }
  qp_tags_.resize(rails_.size());
  for (Rail& rail : rails_) rail.poller->start();
  start_rail_watch();
}

RdmaTransport::~RdmaTransport() { shutdown(); }

void RdmaTransport::open_handles(Rail& rail, int index) {
  rail.pd = std::make_shared<ProtectionDomain>(rail.context);
  rail.channel = std::make_shared<CompletionChannel>(rail.context);
  CqPoller::Handlers h;
  const std::string name = rail.name;
  h.completions = [this, index](const ibv_wc* wcs, int n) { on_completions(index, wcs, n); };
  h.async_event = [this, index](const ibv_async_event& e) { on_async_event(index, e); };
  h.socket_ready = [this](uint64_t tag) { on_socket(tag); };
  h.fatal = [this, index, name](const std::string& why) {
    rail_failed(index, "completion thread of " + name + " failed: " + why);
  };
  rail.poller = std::make_shared<CqPoller>(rail.context, rail.channel, busy_poll_, std::move(h));
  rail.cqs = std::make_shared<CqSet>(rail.context, rail.channel, rail.poller, max_cqe_);
  open_srq(rail);
}

void RdmaTransport::open_srq(Rail& rail) {
  const char* env = std::getenv("RDMAXFER_SRQ");
  const std::string off = env != nullptr ? env : "";
  if (off == "0" || off == "off" || off == "no" || off == "false") {
    rail.srq_off = "turned off by RDMAXFER_SRQ=" + off;
    return;
  }
  const uint32_t chunk = srq_chunk();
  const ibv_device_attr& a = rail.context->device_attr();
  if (a.max_srq == 0 || a.max_srq_wr == 0) {
    rail.srq_off = rail.name + " has no SRQ (ibv_query_device: max_srq " +
                   std::to_string(a.max_srq) + ")";
    return;
  }
  try {
    rail.srq = std::make_shared<SharedReceiveQueue>(rail.pd, settings_.ctrl_size, chunk, kSrqCap);
  } catch (const Error& e) {
    rail.srq_off = e.what();  // the QPs post their own receives, as on a device without SRQ
    log::write(log::Level::kWarning, "rdma: no SRQ on " + rail.name + " (" +
                                         e.what() + "): each QP posts its own receive buffers");
  }
}

Capabilities RdmaTransport::declared() {
  Capabilities caps;
  caps.name = "rdma";
  caps.wire_id = 2;
  caps.auto_rank = 3;  // first wherever a device with an active port offers RC
  caps.one_sided = true;
  caps.write_with_imm = true;
  caps.gpu_direct = true;
  caps.rails = true;
  caps.tls = true;
  return caps;
}

Capabilities RdmaTransport::capabilities() const {
  Capabilities caps = declared();
  caps.max_message = settings_.max_message;
  return caps;
}

std::string RdmaTransport::describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t live = 0;  // the first rail whose device is still held
  while (live + 1 < rails_.size() && !rails_[live].context) ++live;
  if (!rails_[live].context) {
    std::string s = "rdma: every rail's device was removed:";
    for (const Rail& rail : rails_) s += " " + rail.name + " (" + rail.removed + ");";
    return s;
  }
  const DeviceContext& dc = *rails_[live].context;
  const ibv_port_attr& pa = dc.port_attr();
  const bool eth = dc.ethernet();
  std::string s = "rdma: device " + dc.name() + " port " + std::to_string(dc.port()) +
                  ", link layer " + (eth ? "Ethernet (RoCE)" : "InfiniBand") + ", ";
  if (eth) {
    s += "GID index " + std::to_string(dc.gid_index()) + " " + dc.gid_text() + " (" +
         dc.gid_choice() + ")";
  } else {
    s += "LID " + std::to_string(pa.lid);
  }
  s += ", active MTU " + std::to_string(mtu_bytes(pa.active_mtu)) + ", max message " +
       std::to_string(settings_.max_message) + " bytes, poll mode " + config_.poll_mode + ", " +
       std::to_string(config_.default_qps) + " QP(s) per connection and rail, send queue " +
       std::to_string(settings_.limits.sq_depth) + " WRs, eager limit " +
       std::to_string(settings_.eager_limit) + " bytes, " +
       describe_fabric_settings(settings_.limits.fabric) +
       (tls_ ? ", bootstrap under " + tls_->describe() : std::string()) + ", " +
       std::to_string(rails_.size()) + " rail(s):";
  for (size_t i = 0; i < rails_.size(); ++i) {
    s += (i == 0 ? " " : ", ") + rail_text(rails_[i].name, rails_[i].record);
    if (!rails_[i].removed.empty()) s += " removed (" + rails_[i].removed + ")";
    if (rails_[i].returns > 0) {
      s += " (its device came back " + std::to_string(rails_[i].returns) + "x)";
    }
  }
  s += "; receive buffers of " + std::to_string(settings_.ctrl_size) + " bytes:";
  for (size_t i = 0; i < rails_.size(); ++i) {
    const Rail& rail = rails_[i];
    s += (i == 0 ? " " : ", ") + rail.name + " ";
    if (!rail.removed.empty()) {
      s += "none (removed)";
    } else if (rail.srq) {
      s += "SRQ, " + std::to_string(rail.srq->posted()) + " posted of " +
           std::to_string(rail.srq->buffers()) + " (at most " + std::to_string(rail.srq->cap()) +
           ")";
    } else {
      s += "per QP, " + std::to_string(settings_.ctrl_depth) + " each (" + rail.srq_off + ")";
    }
  }
  return s;
}

std::vector<std::string> RdmaTransport::rails() const {
  std::vector<std::string> out;
  for (const Rail& rail : rails_) out.push_back(rail.name);
  return out;
}

std::vector<std::pair<std::string, uint64_t>> RdmaTransport::gauges() const {
  uint64_t posted = 0;
  uint64_t allocated = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Rail& rail : rails_) {
      posted += rail.srq ? rail.srq->posted() : 0;
      allocated += rail.srq ? rail.srq->buffers() : 0;
    }
  }
  for (const auto& c : live_connections()) {
    // Connected: its QPs are paired (a handshake in progress still rearranges them).
    if (c->state() != RdmaConnection::State::kConnected) continue;
    posted += c->posted_receives();
    allocated += c->own_receive_buffers();
  }
  return {{"recv_buffers.posted", posted}, {"recv_buffers.allocated", allocated}};
}

std::shared_ptr<MemoryRegion> RdmaTransport::make_region(uint8_t* addr, uint64_t length,
                                                         uint32_t access,
                                                         std::unique_ptr<PinnedAllocation> owned) {
  auto region = std::make_shared<RdmaRegion>(current_pds(), addr, length, access, std::move(owned));
  track(region);
  return region;
}

std::shared_ptr<MemoryRegion> RdmaTransport::make_device_region(uint8_t* addr, uint64_t length,
                                                                uint32_t access, int dmabuf_fd,
                                                                uint64_t dmabuf_offset) {
  auto region =
      std::make_shared<RdmaRegion>(current_pds(), addr, length, access, dmabuf_fd, dmabuf_offset);
  track(region);
  return region;
}

uint16_t RdmaTransport::listen(const std::string& host, uint16_t port) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) throw Error(ErrorKind::kClosed, "listen: the engine is closed");
  if (acceptor_) {
    throw Error(ErrorKind::kInvalidArgument,
                "listen: this engine already listens on port " + std::to_string(acceptor_->port()) +
                    "; use one engine per listening port");
  }
  acceptor_ = std::make_unique<Acceptor>(
      host, port, declared().wire_id, engine_id(), bootstrap_options(),
      [this](const std::string& peer, const std::string& cause) { accept_failed(peer, cause); },
      [this](AcceptedGroup group) { accept_group(std::move(group)); });
  return acceptor_->port();
}

std::shared_ptr<RdmaConnection> RdmaTransport::prepare(const std::vector<LaneSpec>& lanes) {
  // Each QP's sends and receives complete on a CQ of its rail's CqSet: reserve room for the
  // QPs of each rail there.
  std::vector<int> per_rail(rails_.size(), 0);
  for (const LaneSpec& l : lanes) ++per_rail[static_cast<size_t>(l.rail)];
  const int per_qp = static_cast<int>(settings_.limits.sq_depth + settings_.ctrl_depth);
  uint32_t tag = 0;
  std::vector<Rail> rails;  // a copy: remove_rail may reset rails_'s handles meanwhile
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) throw Error(ErrorKind::kClosed, "the engine is closed");
    rails = rails_;
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto c = it->second.lock();
      if (!c || c->is_closed()) {
        release_cqs_locked(it->first);
        forget_qps_locked(it->first);
        if (c) closed_.push_back(c);  // still held: remove_rail finds its QPs there
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    closed_.erase(std::remove_if(closed_.begin(), closed_.end(),
                                 [](const auto& w) { return w.expired(); }),
                  closed_.end());
    do {
      tag = next_tag_++ & 0xffffff;
    } while (tag == 0 || connections_.count(tag) != 0 || pending_.count(tag) != 0);
    pending_.insert(tag);  // held until the connection is made or given up
  }
  try {
    std::vector<std::shared_ptr<CompletionQueue>> cqs(rails.size());
    for (size_t r = 0; r < rails.size(); ++r) {
      if (per_rail[r] == 0) continue;
      if (!rails[r].removed.empty()) {
        throw Error(ErrorKind::kConnection, "rail " + rails[r].name + " was removed (" +
                                                rails[r].removed + ")");
      }
      cqs[r] = rails[r].cqs->reserve(tag, per_rail[r] * per_qp);
    }
    RdmaShared shared{std::move(rails), std::move(cqs),
                      [this, tag](int rail, uint32_t old_qpn, uint32_t new_qpn) {
                        renumber_qp(rail, old_qpn, new_qpn, tag);
                      }};
    auto conn = std::make_shared<RdmaConnection>(*this, settings_, std::move(shared), tag, lanes);
    attach_protocol(conn);
    std::lock_guard<std::mutex> lock(mu_);
    // A rail removed since the copy: remove_rail did not see this connection, so it goes.
    for (size_t r = 0; r < rails_.size(); ++r) {
      if (per_rail[r] > 0 && !rails_[r].removed.empty()) {
        throw Error(ErrorKind::kConnection, "rail " + rails_[r].name + " was removed (" +
                                                rails_[r].removed + ") while connecting");
      }
    }
    pending_.erase(tag);
    connections_[tag] = conn;
    for (const auto& [rail, qpn] : conn->qp_numbers()) qp_tags_[static_cast<size_t>(rail)][qpn] = tag;
    return conn;
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    release_cqs_locked(tag);
    pending_.erase(tag);
    throw;
  }
}

void RdmaTransport::release_cqs_locked(uint32_t tag) {
  for (Rail& rail : rails_) {
    if (rail.cqs) rail.cqs->release(tag);
  }
}

EndpointRecord RdmaTransport::read_record(int fd, TlsSession* tls, const Deadline& deadline) {
  std::string buf(EndpointRecord::kHeaderSize, '\0');
  recv_exact(fd, buf.data(), buf.size(), deadline,
             "rdma handshake: waiting for the peer's endpoint record", tls);
  buf.resize(EndpointRecord::peek_size(reinterpret_cast<const uint8_t*>(buf.data())));
  recv_exact(fd, buf.data() + EndpointRecord::kHeaderSize,
             buf.size() - EndpointRecord::kHeaderSize, deadline,
             "rdma handshake: reading the peer's QP list", tls);
  return EndpointRecord::unpack(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
}

void RdmaTransport::handshake(RdmaConnection& conn, int fd, TlsSession* tls,
                              const EndpointRecord* peer_record, const Deadline& deadline) {
  const std::string rec = conn.local_record().pack();
  send_exact(fd, rec.data(), rec.size(), deadline, "rdma handshake: sending the endpoint record",
             tls);
  const EndpointRecord peer =
      peer_record != nullptr ? *peer_record : read_record(fd, tls, deadline);
  conn.connect_qps(peer, peer_record != nullptr);
  const uint8_t ready = EndpointRecord::kReadyByte;
  send_exact(fd, &ready, 1, deadline, "rdma handshake: sending READY", tls);
  uint8_t got = 0;
  recv_exact(fd, &got, 1, deadline, "rdma handshake: waiting for the peer's READY", tls);
  if (got != EndpointRecord::kReadyByte) {
    throw Error(ErrorKind::kProtocol, "rdma handshake: the peer sent " + std::to_string(got) +
                                          " instead of READY");
  }
}

std::shared_ptr<RdmaConnection> RdmaTransport::accept_one(AcceptedGroup group) {
  UniqueFd fd = std::move(group.fds[0]);
  std::unique_ptr<TlsSession> tls = group.tls.empty() ? nullptr : std::move(group.tls[0]);
  Deadline deadline(kAcceptHandshakeS);
  // The connector offers QPs on each of its rails: read its record before creating ours.
  const EndpointRecord peer = read_record(fd.get(), tls.get(), deadline);
  const std::vector<LaneSpec> lanes = pair_rails(peer);
  if (lanes.empty()) {
    // Our rails alone (no QP): the connector reports the same error.
    EndpointRecord ours;
    for (const Rail& rail : rails_) ours.rails.push_back(rail.record);
    ours.engine_id = engine_id();
    const std::string rec = ours.pack();
    send_exact(fd.get(), rec.data(), rec.size(), deadline,
               "rdma handshake: sending the endpoint record", tls.get());
    throw Error(ErrorKind::kConnection, no_rail_pair(rails_, peer));
  }
  auto conn = prepare(lanes);
  handshake(*conn, fd.get(), tls.get(), &peer, deadline);
  conn->set_peer_engine(group.hello.engine_id);
  conn->start(std::move(fd), std::move(tls), group.peer);
  return conn;
}

void RdmaTransport::accept_group(AcceptedGroup group) {
  const std::string peer = group.peer;
  try {
    auto conn = accept_one(std::move(group));
    log_accepted(*conn);
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;  // the connection closes with its last holder
    accepted_.push_back(std::move(conn));
    accepted_cv_.notify_all();
  } catch (const Error& e) {
    // A peer whose handshake fails loses its own connection (its connect() reports why); one
    // cut short by shutdown() is no refusal.
    bool closing = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing = shut_down_;
    }
    if (!closing) accept_failed(peer, std::string("rdma handshake: ") + e.what());
  }
}

std::shared_ptr<Channel> RdmaTransport::accept(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!acceptor_) throw Error(ErrorKind::kInvalidArgument, "accept: call listen() first");
  if (!wait_interruptible(accepted_cv_, lock, Deadline(timeout_s),
                          [this] { return !accepted_.empty() || shut_down_; })) {
    throw Error(ErrorKind::kTimeout, accept_timeout_text(timeout_s, acceptor_->port()));
  }
  if (shut_down_) throw Error(ErrorKind::kClosed, "accept: the engine is closed");
  auto conn = std::move(accepted_.front());
  accepted_.pop_front();
  return conn;
}

std::shared_ptr<Channel> RdmaTransport::connect(const std::string& host, uint16_t port,
                                                   const ConnectOptions& options) {
  const int n = options.streams > 0 ? options.streams : config_.default_qps;
  if (n * static_cast<int>(rails_.size()) > EndpointRecord::kMaxQps) {
    throw Error(ErrorKind::kInvalidArgument,
                "streams=" + std::to_string(n) + " on " + std::to_string(rails_.size()) +
                    " rail(s) exceeds " + std::to_string(EndpointRecord::kMaxQps) +
                    " QPs per connection");
  }
  Deadline deadline(options.timeout_s);
  SocketOptions sockets = bootstrap_options();
  sockets.retry_refused = options.retry_refused;
  const std::string peer = host_port(host, port);
  return counted_connect(peer, [&](int* retries) {
    uint64_t peer_engine = 0;
    std::vector<std::unique_ptr<TlsSession>> sessions;
    std::vector<UniqueFd> fds =
        bootstrap_connect(host, port, declared().wire_id, 1, engine_id(), random_u64(), sockets,
                          deadline, retries, &peer_engine, &sessions);
    std::unique_ptr<TlsSession> tls = sessions.empty() ? nullptr : std::move(sessions[0]);
    std::vector<LaneSpec> lanes;
    std::string removed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t r = 0; r < rails_.size(); ++r) {
        if (!rails_[r].removed.empty()) {
          removed += (removed.empty() ? "" : "; ") + rails_[r].name + ": " + rails_[r].removed;
          continue;  // its device was removed
        }
        for (int i = 0; i < n; ++i) lanes.push_back({static_cast<int>(r), EndpointRecord::kAnyRail});
      }
    }
    if (lanes.empty()) {
      throw Error(ErrorKind::kConnection,
                  "every rail of this engine was removed (" + removed + "); open a new engine");
    }
    auto conn = prepare(lanes);
    handshake(*conn, fds[0].get(), tls.get(), nullptr, deadline);
    conn->set_peer_engine(peer_engine);
    conn->start(std::move(fds[0]), std::move(tls), peer);
    return std::static_pointer_cast<Channel>(conn);
  });
}

void RdmaTransport::renumber_qp(int rail, uint32_t old_qpn, uint32_t new_qpn, uint32_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& tags = qp_tags_[static_cast<size_t>(rail)];
  const auto old = tags.find(old_qpn);
  if (old != tags.end() && old->second == tag) tags.erase(old);
  tags[new_qpn] = tag;
}

void RdmaTransport::forget_qps_locked(uint32_t tag) {
  for (auto& tags : qp_tags_) {
    for (auto it = tags.begin(); it != tags.end();) {
      it = it->second == tag ? tags.erase(it) : std::next(it);
    }
  }
}

std::vector<std::shared_ptr<RdmaConnection>> RdmaTransport::live_connections() const {
  std::vector<std::shared_ptr<RdmaConnection>> conns;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [tag, w] : connections_) {
    if (auto c = w.lock()) conns.push_back(std::move(c));
  }
  for (auto& w : closed_) {
    if (auto c = w.lock()) conns.push_back(std::move(c));
  }
  return conns;
}

std::vector<LaneSpec> RdmaTransport::pair_rails(const EndpointRecord& peer) const {
  // For each connector rail that offers QPs, the first of our rails that reaches it, preferring
  // one not paired yet (so two rails each side pair one to one).
  std::vector<int> load(rails_.size(), 0);
  std::vector<LaneSpec> lanes;
  std::vector<EndpointRecord::Rail> records;  // a device that comes back changes its record
  std::vector<bool> removed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Rail& rail : rails_) {
      records.push_back(rail.record);
      removed.push_back(!rail.removed.empty());
    }
  }
  for (size_t c = 0; c < peer.rails.size(); ++c) {
    int n = 0;
    for (const auto& q : peer.qps) n += q.rail == c ? 1 : 0;
    if (n == 0) continue;
    int best = -1;
    for (size_t r = 0; r < rails_.size(); ++r) {
      if (removed[r] || !rails_reach(records[r], peer.rails[c])) continue;
      if (best < 0 || load[r] < load[static_cast<size_t>(best)]) best = static_cast<int>(r);
    }
    if (best < 0) continue;
    ++load[static_cast<size_t>(best)];
    for (int i = 0; i < n; ++i) lanes.push_back({best, static_cast<int>(c)});
  }
  if (static_cast<int>(lanes.size()) > EndpointRecord::kMaxQps) {
    throw Error(ErrorKind::kProtocol, "the peer asks for " + std::to_string(lanes.size()) +
                                          " QPs; at most " +
                                          std::to_string(EndpointRecord::kMaxQps));
  }
  return lanes;
}

void RdmaTransport::abort_all(ErrorKind kind, const std::string& reason) {
  const std::vector<std::shared_ptr<RdmaConnection>> conns = live_connections();
  for (const auto& c : conns) c->abort(kind, reason);
}

void RdmaTransport::shutdown() {
  std::unique_ptr<Acceptor> acceptor;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    accepted_cv_.notify_all();
  }
  connects_->cancel();
  {
    std::lock_guard<std::mutex> lock(mu_);
    acceptor = std::move(acceptor_);
    accepted_.clear();
  }
  stop_rail_watch();  // no rail is removed from here on
  acceptor.reset();  // cuts the handshakes in progress and waits for their threads
  abort_all(ErrorKind::kClosed, "the engine was closed");
  // Drain every connection's flush completions before the completion thread stops.
  const std::vector<std::shared_ptr<RdmaConnection>> conns = live_connections();
  for (const auto& c : conns) c->close();  // closed already: waits (bounded) for the drain
  for (Rail& rail : rails_) {
    if (rail.poller) rail.poller->stop();
  }
  // A closed engine holds no device: its handles go now, not when the object is destroyed
  // (a reference left in a traceback or a cycle would otherwise keep the device, and the
  // kernel's unregistration of it, e.g. rdma link delete, waits for every handle).
  for (size_t r = 0; r < rails_.size(); ++r) {
    if (!rail_removed(r)) release_handles(static_cast<int>(r), "the engine was closed", conns);
  }
}

}  // namespace rdmaxfer
