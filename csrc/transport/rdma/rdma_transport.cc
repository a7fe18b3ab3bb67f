#include "transport/rdma/rdma_transport.h"

#include <algorithm>
#include <cstdlib>
#include <random>

#include "common/error.h"
#include "common/interrupt.h"
#include "transport/rdma/fabric_settings.h"
#include "transport/socket.h"

namespace rdmaxfer {

namespace {
constexpr int kMaxCqe = 16384;
constexpr double kAcceptHandshakeS = 10.0;

std::string poll_mode_of(const std::string& configured) {
  std::string mode = configured;
  if (mode.empty()) {
    const char* env = std::getenv("RDMAXFER_POLL_MODE");
    mode = env != nullptr && *env != '\0' ? env : "event";
  }
  if (mode != "event" && mode != "busy") {
    throw Error(ErrorKind::kInvalidArgument,
                "poll_mode='" + mode + "' must be 'event' (sleep on the completion channel) or "
                                       "'busy' (spin on the CQ)");
  }
  return mode;
}
}  // namespace

RdmaTransport::RdmaTransport(uint64_t engine_id, const RdmaConfig& config)
    : Transport(engine_id), config_(config) {
  config_.poll_mode = poll_mode_of(config_.poll_mode);
  busy_poll_ = config_.poll_mode == "busy";
  if (config_.default_qps <= 0) config_.default_qps = 1;
  if (config_.default_qps > EndpointRecord::kMaxQps) {
    throw Error(ErrorKind::kInvalidArgument,
                "streams=" + std::to_string(config_.default_qps) + " exceeds " +
                    std::to_string(EndpointRecord::kMaxQps) + " QPs per connection");
  }
  settings_.limits.fabric = resolve_fabric_settings(config_);
  context_ = DeviceContext::open(config_.device, config_.port, config_.gid_index);
  const ibv_device_attr& dev = context_->device_attr();
  settings_.eager_limit = config_.eager_limit > 0 ? config_.eager_limit : 8192;
  if (settings_.eager_limit > settings_.ctrl_size - CtrlHeader::kSize - 1024) {
    throw Error(ErrorKind::kInvalidArgument,
                "eager_limit=" + std::to_string(settings_.eager_limit) + " exceeds " +
                    std::to_string(settings_.ctrl_size - CtrlHeader::kSize - 1024) +
                    " bytes on rdma");
  }
  const int max_wr = std::max(16, dev.max_qp_wr);
  settings_.limits.sq_depth = static_cast<uint32_t>(
      std::min(max_wr, config_.sq_depth > 0 ? config_.sq_depth : 256));
  settings_.limits.rq_depth = settings_.ctrl_depth;
  settings_.limits.initiator_depth =
      static_cast<uint8_t>(std::clamp(dev.max_qp_init_rd_atom, 1, 16));
  settings_.limits.responder_resources = static_cast<uint8_t>(std::clamp(dev.max_qp_rd_atom, 1, 16));
  settings_.max_message = context_->port_attr().max_msg_sz > 0
                              ? context_->port_attr().max_msg_sz
                              : (1ull << 30);
  pd_ = std::make_shared<ProtectionDomain>(context_);
  channel_ = std::make_shared<CompletionChannel>(context_);
  CqPoller::Handlers h;
  h.completions = [this](const ibv_wc* wcs, int n) { on_completions(wcs, n); };
  h.async_event = [this](const ibv_async_event& e) { on_async_event(e); };
  h.socket_ready = [this](uint64_t tag) { on_socket(tag); };
  h.fatal = [this](const std::string& why) { abort_all(ErrorKind::kTransport, why); };
  poller_ = std::make_shared<CqPoller>(context_, channel_, busy_poll_, std::move(h));
  cqs_ = std::make_unique<CqSet>(context_, channel_, poller_, std::min(kMaxCqe, dev.max_cqe));
  poller_->start();
}

RdmaTransport::~RdmaTransport() { shutdown(); }

Capabilities RdmaTransport::capabilities() const {
  Capabilities caps;
  caps.kind = TransportKind::kRdma;
  caps.one_sided = true;
  caps.write_with_imm = true;
  caps.gpu_direct = false;
  caps.max_message = settings_.max_message;
  return caps;
}

std::string RdmaTransport::describe() const {
  const ibv_port_attr& pa = context_->port_attr();
  const bool eth = context_->ethernet();
  std::string s = "rdma: device " + context_->name() + " port " +
                  std::to_string(context_->port()) + ", link layer " +
                  (eth ? "Ethernet (RoCE)" : "InfiniBand") + ", ";
  if (eth) {
    s += "GID index " + std::to_string(context_->gid_index()) + " " + context_->gid_text() +
         " (" + context_->gid_choice() + ")";
  } else {
    s += "LID " + std::to_string(pa.lid);
  }
  s += ", active MTU " + std::to_string(mtu_bytes(pa.active_mtu)) + ", max message " +
       std::to_string(settings_.max_message) + " bytes, poll mode " + config_.poll_mode + ", " +
       std::to_string(config_.default_qps) + " QP(s) per connection, send queue " +
       std::to_string(settings_.limits.sq_depth) + " WRs, eager limit " +
       std::to_string(settings_.eager_limit) + " bytes, " +
       describe_fabric_settings(settings_.limits.fabric);
  return s;
}

std::shared_ptr<MemoryRegion> RdmaTransport::make_region(uint8_t* addr, uint64_t length,
                                                         uint32_t access,
                                                         std::unique_ptr<PinnedAllocation> owned) {
  return std::make_shared<RdmaRegion>(pd_, addr, length, access, std::move(owned));
}

std::shared_ptr<MemoryRegion> RdmaTransport::make_device_region(uint8_t* addr, uint64_t length,
                                                                uint32_t access, int dmabuf_fd,
                                                                uint64_t dmabuf_offset) {
  return std::make_shared<RdmaRegion>(pd_, addr, length, access, dmabuf_fd, dmabuf_offset);
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
      host, port, TransportKind::kRdma, engine_id(), bootstrap_options(),
      [this](const std::string& peer, const std::string& cause) { accept_failed(peer, cause); },
      [this](AcceptedGroup group) { accept_group(std::move(group)); });
  return acceptor_->port();
}

std::shared_ptr<RdmaConnection> RdmaTransport::prepare(int n_qps) {
  const int need = n_qps * static_cast<int>(settings_.limits.sq_depth + settings_.ctrl_depth);
  uint32_t tag = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) throw Error(ErrorKind::kClosed, "the engine is closed");
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto c = it->second.lock();
      if (!c || c->is_closed()) {
        cqs_->release(it->first);
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    do {
      tag = next_tag_++ & 0xffffff;
    } while (tag == 0 || connections_.count(tag) != 0 || pending_.count(tag) != 0);
    pending_.insert(tag);  // held until the connection is made or given up
  }
  std::shared_ptr<CompletionQueue> cq;
  try {
    cq = cqs_->reserve(tag, need);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.erase(tag);
    throw;
  }
  try {
    auto conn = std::make_shared<RdmaConnection>(*this, settings_,
                                                 RdmaShared{pd_, cq, poller_}, tag, n_qps);
    attach_protocol(conn);
    std::lock_guard<std::mutex> lock(mu_);
    pending_.erase(tag);
    connections_[tag] = conn;
    return conn;
  } catch (...) {
    cqs_->release(tag);
    std::lock_guard<std::mutex> lock(mu_);
    pending_.erase(tag);
    throw;
  }
}

EndpointRecord RdmaTransport::read_record(int fd, const Deadline& deadline) {
  std::string buf(EndpointRecord::kHeaderSize, '\0');
  recv_exact(fd, buf.data(), buf.size(), deadline,
             "rdma handshake: waiting for the peer's endpoint record");
  const int n = EndpointRecord::peek_qps(reinterpret_cast<const uint8_t*>(buf.data()));
  buf.resize(EndpointRecord::size_for(n));
  recv_exact(fd, buf.data() + EndpointRecord::kHeaderSize,
             buf.size() - EndpointRecord::kHeaderSize, deadline,
             "rdma handshake: reading the peer's QP list");
  return EndpointRecord::unpack(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
}

void RdmaTransport::handshake(RdmaConnection& conn, int fd, const EndpointRecord* peer_record,
                              const Deadline& deadline) {
  const std::string rec = conn.local_record().pack();
  send_exact(fd, rec.data(), rec.size(), deadline, "rdma handshake: sending the endpoint record");
  const EndpointRecord peer = peer_record != nullptr ? *peer_record : read_record(fd, deadline);
  conn.connect_qps(peer);
  const uint8_t ready = EndpointRecord::kReadyByte;
  send_exact(fd, &ready, 1, deadline, "rdma handshake: sending READY");
  uint8_t got = 0;
  recv_exact(fd, &got, 1, deadline, "rdma handshake: waiting for the peer's READY");
  if (got != EndpointRecord::kReadyByte) {
    throw Error(ErrorKind::kProtocol, "rdma handshake: the peer sent " + std::to_string(got) +
                                          " instead of READY");
  }
}

std::shared_ptr<RdmaConnection> RdmaTransport::accept_one(AcceptedGroup group) {
  UniqueFd fd = std::move(group.fds[0]);
  Deadline deadline(kAcceptHandshakeS);
  // The connector states the QP count in its record: read it before creating ours.
  const EndpointRecord peer = read_record(fd.get(), deadline);
  auto conn = prepare(static_cast<int>(peer.qps.size()));
  handshake(*conn, fd.get(), &peer, deadline);
  conn->start(std::move(fd), group.peer);
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
    throw Error(ErrorKind::kTimeout,
                "accept: no peer connected within " + seconds_text(timeout_s) +
                    " s; raise timeout= or check that the peer connects to port " +
                    std::to_string(acceptor_->port()));
  }
  if (shut_down_) throw Error(ErrorKind::kClosed, "accept: the engine is closed");
  auto conn = std::move(accepted_.front());
  accepted_.pop_front();
  return conn;
}

std::shared_ptr<Channel> RdmaTransport::connect(const std::string& host, uint16_t port,
                                                   const ConnectOptions& options) {
  const int n = options.streams > 0 ? options.streams : config_.default_qps;
  if (n > EndpointRecord::kMaxQps) {
    throw Error(ErrorKind::kInvalidArgument, "streams=" + std::to_string(n) + " exceeds " +
                                                 std::to_string(EndpointRecord::kMaxQps) +
                                                 " QPs per connection");
  }
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  Deadline deadline(options.timeout_s);
  SocketOptions sockets = bootstrap_options();
  sockets.retry_refused = options.retry_refused;
  const std::string peer = host_port(host, port);
  return counted_connect(peer, [&](int* retries) {
    std::vector<UniqueFd> fds = bootstrap_connect(host, port, TransportKind::kRdma, 1,
                                                  engine_id(), rng(), sockets, deadline, retries);
    auto conn = prepare(n);
    handshake(*conn, fds[0].get(), nullptr, deadline);
    conn->start(std::move(fds[0]), peer);
    return std::static_pointer_cast<Channel>(conn);
  });
}

std::shared_ptr<RdmaConnection> RdmaTransport::find(uint32_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = connections_.find(tag);
  return it == connections_.end() ? nullptr : it->second.lock();
}

void RdmaTransport::on_completions(const ibv_wc* wcs, int n) {
  std::shared_ptr<RdmaConnection> conn;
  for (int i = 0; i < n; ++i) {
    const uint32_t tag = wr_tag(wcs[i].wr_id);
    if (!conn || conn->tag() != tag) conn = find(tag);
    if (conn) conn->on_completion(wcs[i]);  // none: a flush after the connection was freed
  }
}

void RdmaTransport::on_async_event(const ibv_async_event& event) {
  const std::string what =
      std::string("asynchronous event: ") + verbs().event_type_str(event.event_type);
  switch (event.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR: {
      const auto tag = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(event.element.qp->qp_context));
      if (auto conn = find(tag)) conn->on_qp_event(what);
      return;
    }
    case IBV_EVENT_CQ_ERR:
    case IBV_EVENT_DEVICE_FATAL:
    case IBV_EVENT_PORT_ERR:
      abort_all(ErrorKind::kTransport, "device " + context_->name() + ": " + what);
      return;
    default: return;  // informational (LID change, last WQE reached, ...)
  }
}

void RdmaTransport::on_socket(uint64_t tag) {
  if (auto conn = find(static_cast<uint32_t>(tag))) conn->on_socket_ready();
}

void RdmaTransport::abort_all(ErrorKind kind, const std::string& reason) {
  std::vector<std::shared_ptr<RdmaConnection>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [tag, w] : connections_) {
      if (auto c = w.lock()) conns.push_back(std::move(c));
    }
  }
  for (auto& c : conns) c->abort(kind, reason);
}

void RdmaTransport::shutdown() {
  std::unique_ptr<Acceptor> acceptor;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    accepted_cv_.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    acceptor = std::move(acceptor_);
    accepted_.clear();
  }
  acceptor.reset();  // cuts the handshakes in progress and waits for their threads
  abort_all(ErrorKind::kClosed, "the engine was closed");
  // Drain every connection's flush completions before the completion thread stops.
  std::vector<std::shared_ptr<RdmaConnection>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [tag, w] : connections_) {
      if (auto c = w.lock()) conns.push_back(std::move(c));
    }
  }
  for (auto& c : conns) c->close();  // closed already: waits (bounded) for the drain
  poller_->stop();
}

}  // namespace rdmaxfer
