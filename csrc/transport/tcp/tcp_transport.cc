#include "transport/tcp/tcp_transport.h"

#include <algorithm>

#include "common/cpus.h"
#include "common/error.h"
#include "common/random.h"
#include "transport/socket.h"

namespace rdmaxfer {

TcpTransport::TcpTransport(uint64_t engine_id, const TcpConfig& config)
    : Transport(engine_id), config_(config) {
  if (config_.io_threads <= 0) {
    // TLS passes every byte through a core twice more (encrypting, decrypting, and libssl's
    // copy of each record), so its streams get threads of their own where cores are spare:
    // half the CPUs, 2 to 8. Plain TCP only copies: 2 threads.
    const int cpus = usable_cpus();
    config_.io_threads =
        config_.tls ? std::min(cpus, std::clamp(cpus / 2, 2, 8)) : std::min(2, cpus);
  }
  if (config_.default_streams <= 0) {
    config_.default_streams = config_.tls ? std::max(4, config_.io_threads) : 4;
  }
  if (config_.default_streams > Hello::kMaxStreams) {
    throw Error(ErrorKind::kInvalidArgument,
                "streams=" + std::to_string(config_.default_streams) + " exceeds " +
                    std::to_string(Hello::kMaxStreams));
  }
  if (config_.eager_limit > (1u << 20)) {
    throw Error(ErrorKind::kInvalidArgument, "eager_limit above 1 MiB is not supported");
  }
  if (config_.tls) {
    tls_ = std::make_shared<const TlsContext>(config_.tls_settings);
  }
  for (int i = 0; i < config_.io_threads; ++i) {
    loops_.push_back(std::make_unique<IoLoop>(config_.poll_mode, stats()));
  }
}

TcpTransport::~TcpTransport() { shutdown(); }

Capabilities TcpTransport::declared() {
  Capabilities caps;
  caps.name = "tcp";
  caps.wire_id = kTcpWireId;
  caps.auto_rank = 1;  // everywhere, behind any fabric
  caps.one_sided = true;
  caps.tls = true;
  return caps;
}

std::string TcpTransport::describe() const {
  return "tcp: " + std::to_string(loops_.size()) + " I/O threads, " +
         std::to_string(config_.default_streams) + " streams per connection, socket buffers " +
         (config_.socket_buffer > 0 ? std::to_string(config_.socket_buffer) + " bytes"
                                    : std::string("autotuned")) +
         ", eager limit " + std::to_string(config_.eager_limit) + " bytes, poll mode " +
         poll_mode_name(config_.poll_mode) +
         (tls_                     ? ", " + tls_->describe()
          : config_.secret.empty() ? std::string(", no shared secret")
                                   : std::string(", authenticated (shared secret)"));
}

SocketOptions TcpTransport::socket_options() const {
  SocketOptions o;
  o.buffer_bytes = config_.socket_buffer;
  o.secret = config_.secret;
  o.tls = tls_;
  o.pending = connects_;
  return o;
}

uint16_t TcpTransport::listen(const std::string& host, uint16_t port) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) throw Error(ErrorKind::kClosed, "listen: the engine is closed");
  if (acceptor_) {
    throw Error(ErrorKind::kInvalidArgument,
                "listen: this engine already listens on port " + std::to_string(acceptor_->port()) +
                    "; use one engine per listening port");
  }
  acceptor_ = std::make_unique<Acceptor>(
      host, port, declared().wire_id, engine_id(), socket_options(),
      [this](const std::string& peer, const std::string& cause) { accept_failed(peer, cause); });
  return acceptor_->port();
}

std::shared_ptr<Channel> TcpTransport::accept(double timeout_s) {
  Acceptor* acceptor = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!acceptor_) {
      throw Error(ErrorKind::kInvalidArgument, "accept: call listen() first");
    }
    acceptor = acceptor_.get();
  }
  std::optional<AcceptedGroup> group = acceptor->accept(timeout_s);
  if (!group) throw Error(ErrorKind::kTimeout, accept_timeout_text(timeout_s, acceptor->port()));
  auto conn = adopt(std::move(group->fds), std::move(group->tls), group->peer,
                    group->hello.engine_id);
  log_accepted(*conn);
  return conn;
}

std::shared_ptr<Channel> TcpTransport::connect(const std::string& host, uint16_t port,
                                                  const ConnectOptions& options) {
  const int streams = options.streams > 0 ? options.streams : config_.default_streams;
  Deadline deadline(options.timeout_s);
  SocketOptions sockets = socket_options();
  sockets.retry_refused = options.retry_refused;
  const std::string peer = host_port(host, port);
  return counted_connect(peer, [&](int* retries) {
    uint64_t peer_engine = 0;
    std::vector<std::unique_ptr<TlsSession>> tls;
    std::vector<UniqueFd> fds =
        bootstrap_connect(host, port, declared().wire_id, streams, engine_id(), random_u64(),
                          sockets, deadline, retries, &peer_engine, &tls);
    return adopt(std::move(fds), std::move(tls), peer, peer_engine);
  });
}

std::shared_ptr<Channel> TcpTransport::adopt(std::vector<UniqueFd> fds,
                                             std::vector<std::unique_ptr<TlsSession>> tls,
                                             const std::string& peer, uint64_t peer_engine) {
  auto conn = std::make_shared<TcpConnection>(*this, config_, peer, peer_engine);
  conn->set_peer_engine(peer_engine);
  attach_protocol(conn);
  std::vector<IoLoop*> loops;
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) throw Error(ErrorKind::kClosed, "the engine is closed");
  for (size_t i = 0; i < fds.size(); ++i) {
    loops.push_back(loops_[next_loop_++ % loops_.size()].get());
  }
  conn->start(std::move(fds), std::move(tls), loops);
  // Forget connections that are gone, so the list does not grow without bound.
  std::vector<std::weak_ptr<TcpConnection>> live;
  for (auto& w : connections_) {
    if (auto c = w.lock(); c && !c->is_closed()) live.push_back(w);
  }
  live.push_back(conn);
  connections_.swap(live);
  return conn;
}

void TcpTransport::shutdown() {
  std::vector<std::weak_ptr<TcpConnection>> conns;
  std::unique_ptr<Acceptor> acceptor;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    conns.swap(connections_);
    acceptor = std::move(acceptor_);
  }
  connects_->cancel();
  acceptor.reset();
  for (auto& w : conns) {
    if (auto c = w.lock()) c->abort(ErrorKind::kClosed, "the engine was closed");
  }
  for (auto& loop : loops_) loop->stop();
}

std::shared_ptr<MemoryRegion> TcpTransport::make_region(uint8_t* addr, uint64_t length,
                                                        uint32_t access,
                                                        std::unique_ptr<PinnedAllocation> owned) {
  if (!owned) check_mapped(addr, length);
  return std::make_shared<MemoryRegion>(addr, length, access, std::move(owned));
}

}  // namespace rdmaxfer
