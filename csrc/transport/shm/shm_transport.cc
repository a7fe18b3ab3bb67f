#include "transport/shm/shm_transport.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "common/deadline.h"
#include "common/error.h"
#include "common/interrupt.h"
#include "transport/bootstrap.h"
#include "transport/shm/cuda_ipc.h"
#include "transport/shm/same_host.h"
#include "transport/shm/shm_channel.h"
#include "transport/socket.h"

namespace rdmaxfer {

namespace {

constexpr double kShmHandshakeTimeoutS = 5.0;

// The abstract UNIX address of the shm listener on `port` (no file; gone with the socket).
socklen_t abstract_address(uint16_t port, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  const std::string name = "rdmaxfer-shm:" + std::to_string(port);
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

// Throws Error(kUnsupported) unless `host` names an address of this machine (binding a
// datagram socket to it succeeds only then).
void require_local_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &found);
  if (rc != 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "cannot resolve host '" + host + "': " + gai_strerror(rc) +
                    "; pass an IP address or a resolvable host name");
  }
  bool local = false;
  for (addrinfo* ai = found; ai != nullptr && !local; ai = ai->ai_next) {
    UniqueFd probe(socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    local = probe.valid() && bind(probe.get(), ai->ai_addr, ai->ai_addrlen) == 0;
  }
  freeaddrinfo(found);
  if (!local) {
    throw Error(ErrorKind::kUnsupported,
                "transport 'shm' reaches only processes on this host, and '" + host +
                    "' is not an address of this machine; use transport='tcp' or 'rdma'",
                EADDRNOTAVAIL);
  }
}

UniqueFd unix_socket() {
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) throw_errno(ErrorKind::kTransport, "shm: socket(AF_UNIX)", errno);
  return fd;
}

int gather_threads() {
  return static_cast<int>(std::min(4u, std::max(1u, std::thread::hardware_concurrency())));
}
}  // namespace

ShmTransport::ShmTransport(uint64_t engine_id, const TransportConfig& config)
    : Transport(engine_id),
      config_(config),
      wait_budget_(config.poll_mode, SpinBudget::Kind::kWait),
      gather_workers_(gather_threads()) {
  check_usable();
}

ShmTransport::ShmTransport(Transport& owner, const TransportConfig& config)
    : Transport(owner),
      config_(config),
      wait_budget_(config.poll_mode, SpinBudget::Kind::kWait),
      gather_workers_(gather_threads()) {
  check_usable();
  // shm runs no TLS, so it cannot check a certificate: with TLS by certificates (no shared
  // secret for shm's challenge) same-host peers go over the network transport, under TLS.
  const std::string network = owner.capabilities().name;
  TlsSettings tls;
  if (config.tls(network, &tls) && tls.secret.empty()) {
    throw Error(ErrorKind::kUnsupported,
                "TLS authenticates peers by certificate, which shm (no TLS) cannot check, so "
                "same-host peers connect over " + network + " with TLS");
  }
}

void ShmTransport::check_usable() const {
  const std::string why = shm_unavailable_reason();
  if (!why.empty()) throw Error(ErrorKind::kUnsupported, "transport 'shm' is unavailable: " + why);
  SocketOptions options;
  options.secret = config_.secret;
  check_secret_usable(options);
}

ShmTransport::~ShmTransport() { shutdown(); }

Capabilities ShmTransport::declared() {
  Capabilities c;
  c.name = "shm";
  c.wire_id = 4;
  c.network = false;
  c.same_host_companion = true;
  c.one_sided = true;
  c.device_ipc = true;
  return c;
}

std::string ShmTransport::describe() const {
  return std::string("shm (same host: control ring in a memfd with an eventfd doorbell, "
                     "one-sided copies with process_vm_readv/writev, GPU memory by CUDA IPC") +
         ", poll mode " + poll_mode_name(config_.poll_mode) +
         (config_.secret.empty() ? ", no shared secret)" : ", authenticated (shared secret))");
}

std::shared_ptr<MemoryRegion> ShmTransport::make_region(
    uint8_t* addr, uint64_t length, uint32_t access, std::unique_ptr<PinnedAllocation> owned) {
  if (!owned) check_mapped(addr, length);
  return std::make_shared<MemoryRegion>(addr, length, access, std::move(owned));
}

std::shared_ptr<MemoryRegion> ShmTransport::make_device_region(uint8_t* addr, uint64_t length,
                                                               uint32_t access, int /*dmabuf_fd*/,
                                                               uint64_t /*dmabuf_offset*/) {
  return std::make_shared<IpcDeviceRegion>(addr, length, access);
}

uint16_t ShmTransport::listen(const std::string& host, uint16_t port) {
  require_local_host(host);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) throw Error(ErrorKind::kClosed, "the engine is closed");
    if (port_ != 0) {
      throw Error(ErrorKind::kInvalidArgument,
                  "listen: this engine already listens on port " + std::to_string(port_));
    }
  }
  UniqueFd fd = unix_socket();
  std::mt19937 pick(std::random_device{}());
  const bool any = port == 0;
  for (int attempt = 0;; ++attempt) {
    const uint16_t candidate =
        any ? static_cast<uint16_t>(20000 + pick() % 40000) : port;
    sockaddr_un addr{};
    const socklen_t len = abstract_address(candidate, &addr);
    if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0) {
      port = candidate;
      break;
    }
    if (errno != EADDRINUSE || !any || attempt > 100) {
      throw_errno(ErrorKind::kTransport,
                  "listen: binding the shm socket for port " + std::to_string(candidate), errno);
    }
  }
  if (::listen(fd.get(), 128) != 0) throw_errno(ErrorKind::kTransport, "listen(AF_UNIX)", errno);
  std::lock_guard<std::mutex> lock(mu_);
  port_ = port;
  listen_fd_ = std::move(fd);
  acceptor_ = std::thread([this] { run_acceptor(); });
  return port;
}

void ShmTransport::run_acceptor() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_) return;
    }
    if (handshakes_.full()) {
      poll(nullptr, 0, 10);  // every handshake slot taken: clients wait in the backlog
      continue;
    }
    pollfd p{listen_fd_.get(), POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) continue;
    const std::string peer = "shm:" + std::to_string(port_) + " (client)";
    try {
      handshakes_.start(std::move(fd),
                        [this, peer](UniqueFd conn) { accept_client(std::move(conn), peer); });
    } catch (const Error& e) {
      accept_failed(peer, e.what());
    }
  }
}

void ShmTransport::accept_client(UniqueFd fd, const std::string& peer) {
  try {
    const Hello hello = server_handshake(fd.get(), declared().wire_id, engine_id(), config_.secret);
    auto channel =
        ShmChannel::establish(*this, std::move(fd), peer, Deadline(kShmHandshakeTimeoutS));
    channel->set_peer_engine(hello.engine_id);
    adopt(channel);
    log_accepted(*channel);
    std::lock_guard<std::mutex> lock(mu_);
    accepted_.push_back(channel);
    cv_.notify_all();
  } catch (const Error& e) {
    // A peer that fails the handshake loses its own connection, nothing else; one cut short
    // by shutdown() is no refusal. One that is not on this host for shm (another user,
    // namespace, CMA refused) is told so and, with transport="auto", connects over the network
    // transport instead: not an error here.
    bool closing = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing = shut_down_;
    }
    if (closing) return;
    if (e.kind() == ErrorKind::kUnsupported) {
      log::write(log::Level::kInfo, "shm connection from " + peer + " not taken: " + e.what());
    } else {
      accept_failed(peer, e.what());
    }
  }
}

void ShmTransport::adopt(const std::shared_ptr<ShmChannel>& channel) {
  attach_protocol(channel);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) throw Error(ErrorKind::kClosed, "the engine is closed");
    channels_.push_back(channel);
  }
  channel->start_reader();
}

std::shared_ptr<Channel> ShmTransport::accept(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (port_ == 0) throw Error(ErrorKind::kInvalidArgument, "accept: call listen() first");
  if (!wait_interruptible(cv_, lock, Deadline(timeout_s),
                          [this] { return !accepted_.empty() || shut_down_; })) {
    throw Error(ErrorKind::kTimeout, accept_timeout_text(timeout_s, port_));
  }
  if (shut_down_) throw Error(ErrorKind::kClosed, "accept: the engine is closed");
  auto channel = std::move(accepted_.front());
  accepted_.pop_front();
  return channel;
}

std::shared_ptr<Channel> ShmTransport::connect(const std::string& host, uint16_t port,
                                               const ConnectOptions& options) {
  const std::string where = "shm:" + host_port(host, port);
  return counted_connect(where, [&](int* retries) -> std::shared_ptr<Channel> {
    require_local_host(host);
    const Deadline deadline(options.timeout_s);
    sockaddr_un addr{};
    const socklen_t len = abstract_address(port, &addr);
    double backoff = 0.05;
    for (;;) {
      UniqueFd fd = unix_socket();
      if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0 ||
          errno == EINPROGRESS) {
        const uint64_t peer_engine =
            client_handshake(fd.get(), Hello{declared().wire_id, 0, 1, 0, engine_id(), 0},
                             config_.secret, deadline, where);
        auto channel = ShmChannel::establish(*this, std::move(fd), where, deadline);
        channel->set_peer_engine(peer_engine);
        adopt(channel);
        return channel;
      }
      const int err = errno;
      if (err == EAGAIN && !deadline.expired()) {
        sleep_interruptible(0.001, deadline);  // the listener's backlog is full
        continue;
      }
      if ((err != ECONNREFUSED && err != ENOENT) || !options.retry_refused ||
          deadline.expired()) {
        throw Error(ErrorKind::kConnection,
                    errno_text("connect to " + where, err) +
                        (err == ECONNREFUSED ? " (no rdmaxfer shm engine listens on port " +
                                                   std::to_string(port) + " of this host)"
                                             : ""),
                    err);
      }
      ++*retries;
      sleep_interruptible(backoff, deadline);
      backoff = std::min(backoff * 2, 1.0);
    }
  }, options.probe);
}

void ShmTransport::reader_started() {
  std::lock_guard<std::mutex> lock(mu_);
  ++readers_;
}

void ShmTransport::reader_finished() {
  std::lock_guard<std::mutex> lock(mu_);
  --readers_;
  cv_.notify_all();
}

void ShmTransport::shutdown() {
  std::vector<std::weak_ptr<ShmChannel>> channels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    channels.swap(channels_);
    accepted_.clear();
    cv_.notify_all();
  }
  if (acceptor_.joinable()) acceptor_.join();
  handshakes_.stop();
  listen_fd_.reset();
  for (auto& w : channels) {
    if (auto c = w.lock()) c->abort(ErrorKind::kClosed, "the engine was closed");
  }
  gather_workers_.stop();
  // The readers touch this transport until they exit; they do so once their socket is shut.
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return readers_ == 0; });
}

}  // namespace rdmaxfer
