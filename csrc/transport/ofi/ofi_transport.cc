#include "transport/ofi/ofi_transport.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <utility>

#include "common/error.h"
#include "common/interrupt.h"
#include "common/log.h"
#include "common/name_list.h"
#include "common/random.h"
#include "cuda/cuda_api.h"
#include "cuda/cuda_memory.h"
#include "transport/socket.h"

namespace rdmaxfer {

namespace {

constexpr double kOfiAcceptHandshakeS = 10.0;
constexpr int kKeyTries = 16;
constexpr double kRailWatchS = 0.5;  // how often the rail watch lets channels ask rails back

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

OfiEndpointRecord read_record(int fd, TlsSession* tls, const Deadline& deadline) {
  std::string buf(OfiEndpointRecord::kHeaderSize, '\0');
  recv_exact(fd, buf.data(), buf.size(), deadline,
             "ofi handshake: waiting for the peer's endpoint record", tls);
  buf.resize(OfiEndpointRecord::peek_size(reinterpret_cast<const uint8_t*>(buf.data())));
  recv_exact(fd, buf.data() + OfiEndpointRecord::kHeaderSize,
             buf.size() - OfiEndpointRecord::kHeaderSize, deadline,
             "ofi handshake: reading the peer's address", tls);
  return OfiEndpointRecord::unpack(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
}

}  // namespace

OfiConfig OfiConfig::from(const TransportConfig& config) {
  OfiConfig c;
  c.provider = config.setting("ofi", "provider", env_or_empty("RDMAXFER_OFI_PROVIDER"));
  c.iface = config.setting("ofi", "iface", env_or_empty("RDMAXFER_OFI_IFACE"));
  c.secret = config.secret;
  c.poll_mode = config.poll_mode;
  const std::string hmem = config.setting("ofi", "hmem", env_or_empty("RDMAXFER_OFI_HMEM"));
  c.hmem = !(hmem == "0" || hmem == "off" || hmem == "no" || hmem == "false");
  c.tls = config.tls("ofi", &c.tls_settings);
  return c;
}

namespace {
// What `check` answers for `config`'s provider and interface, asked once per process and kept
// in `known` (a probe opens a fabric and its devices: milliseconds).
template <typename Check>
std::string once_per_config(std::map<std::pair<std::string, std::string>, std::string>* known,
                            std::mutex* mu, const OfiConfig& config, Check check) {
  std::lock_guard<std::mutex> lock(*mu);
  const auto key = std::make_pair(config.provider, config.iface);
  auto it = known->find(key);
  if (it != known->end()) return it->second;
  std::string why;
  if (ofi_api(&why) != nullptr) {
    try {
      why = check();
    } catch (const Error& e) {
      why = e.what();
    }
  }
  (*known)[key] = why;
  return why;
}
}  // namespace

std::string ofi_unavailable_reason(const OfiConfig& config) {
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, std::string> known;
  // With no provider named, loading libfabric is the whole check: asking fi_getinfo for every
  // provider makes libfabric's verbs provider open each RDMA device and keep it open for the
  // life of the process (a device then cannot be removed, `rdma link delete` blocks), and
  // transport="auto" never picks ofi. A named provider is probed; an engine opens its domain.
  return once_per_config(&known, &mu, config, [&config]() -> std::string {
    if (!config.provider.empty()) {
      for (const std::string& name : ofi_rail_names(config)) {
        OfiDomain::probe(config.provider, name);
      }
    }
    return std::string();
  });
}

std::string ofi_auto_unavailable_reason(const OfiConfig& config) {
  if (!config.provider.empty() && emulated_provider(config.provider)) {
    return "RDMAXFER_OFI_PROVIDER names " + config.provider +
           ", which emulates RDMA over sockets or memory (only transport='ofi' takes it)";
  }
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, std::string> known;
  return once_per_config(&known, &mu, config, [&config]() -> std::string {
    const OfiSettings s = OfiDomain::probe(config.provider, ofi_rail_names(config).front());
    return s.rdma_fabric ? std::string()
                         : "libfabric's first provider " + s.provider + " emulates RDMA";
  });
}

std::vector<std::string> ofi_rail_names(const OfiConfig& config) {
  const std::vector<std::string> names = split_names(config.iface);
  if (names.size() == 1 && names[0] == "auto") {
    std::vector<std::string> all = OfiDomain::domains(config.provider);
    if (all.size() > kOfiMaxRails) {
      log::write(log::Level::kInfo, "ofi: RDMAXFER_OFI_IFACE=auto takes the first " +
                                        std::to_string(kOfiMaxRails) + " of " +
                                        std::to_string(all.size()) + " domains");
      all.resize(kOfiMaxRails);
    }
    return all;
  }
  if (names.empty()) return {""};
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == "auto" ||
        std::find(names.begin(), names.begin() + static_cast<long>(i), names[i]) !=
            names.begin() + static_cast<long>(i)) {
      throw Error(ErrorKind::kInvalidArgument,
                  "ofi.iface / RDMAXFER_OFI_IFACE='" + config.iface + "' lists " + names[i] +
                      (names[i] == "auto" ? " among other names" : " twice") +
                      ": name each domain once (\"rxe0,rxe2\"), or \"auto\" alone");
    }
  }
  if (names.size() > kOfiMaxRails) {
    throw Error(ErrorKind::kInvalidArgument,
                "ofi.iface / RDMAXFER_OFI_IFACE='" + config.iface + "' lists " +
                    std::to_string(names.size()) + " domains; an engine opens at most " +
                    std::to_string(kOfiMaxRails));
  }
  return names;
}

OfiTransport::OfiTransport(uint64_t engine_id, OfiConfig config)
    : Transport(engine_id), config_(std::move(config)) {
  if (config_.tls) tls_ = std::make_shared<const TlsContext>(config_.tls_settings);
  std::string no_cuda;
  const bool ask_hmem = config_.hmem && cuda_api(&no_cuda) != nullptr;
  const std::vector<std::string> names = ofi_rail_names(config_);
  for (size_t i = 0; i < names.size(); ++i) {
    // Every rail takes rail 0's provider (the same MR mode, key size and limits).
    const std::string provider = i == 0 ? config_.provider : domains_[0]->settings().provider;
    domains_.push_back(OfiDomain::open(provider, names[i], config_.poll_mode, ask_hmem));
    const OfiSettings& s = domains_.back()->settings();
    if (s.mr_virt_addr != domains_[0]->settings().mr_virt_addr) {
      throw Error(ErrorKind::kUnsupported,
                  "ofi rails " + domains_[0]->settings().domain + " and " + s.domain +
                      " address remote memory differently (FI_MR_VIRT_ADDR on one only); "
                      "name domains of one kind in RDMAXFER_OFI_IFACE");
    }
  }
  for (auto& domain : domains_) {
    domain->set_remote_data_handler([this](uint32_t token) { on_remote_data(token); });
    domain->start();
    log::write(log::Level::kDebug, "ofi transport: " + describe_settings(domain->settings()));
  }
}

OfiTransport::~OfiTransport() { shutdown(); }

Capabilities OfiTransport::declared() {
  Capabilities c;
  c.name = "ofi";
  c.wire_id = 5;
  // transport="auto": after verbs RC, before TCP, and only over a hardware RDMA provider
  // (ofi_auto_unavailable_reason).
  c.auto_rank = 2;
  c.one_sided = true;
  c.write_with_imm = true;
  c.tls = true;
  c.max_message = 0;  // cut into parts of at most max_msg_size
  return c;
}

Capabilities OfiTransport::capabilities() const {
  Capabilities c = declared();
  // Every NIC reads and writes GPU memory.
  c.gpu_direct = std::all_of(domains_.begin(), domains_.end(),
                             [](const auto& d) { return d->settings().hmem; });
  return c;
}

std::string OfiTransport::gpu_direct_off() const {
  if (capabilities().gpu_direct) return "";
  return "libfabric's provider " + domains_[0]->settings().provider + " grants no FI_HMEM here" +
         (config_.hmem ? "" : " (RDMAXFER_OFI_HMEM=0)");
}

std::vector<std::string> OfiTransport::rails() const {
  std::vector<std::string> names;
  for (const auto& d : domains_) names.push_back(d->settings().domain);
  return names;
}

std::string OfiTransport::describe() const {
  std::string s = "ofi: " + describe_settings(domains_[0]->settings());
  for (size_t i = 1; i < domains_.size(); ++i) {
    s += "; rail " + std::to_string(i) + ": " + domains_[i]->settings().domain;
  }
  return s + (tls_ ? ", bootstrap and control stream under " + tls_->describe() : std::string());
}

SocketOptions OfiTransport::bootstrap_options() const {
  SocketOptions o;
  o.secret = config_.secret;
  o.tls = tls_;
  o.pending = connects_;
  return o;
}

uint32_t OfiTransport::random_key() {
  uint32_t k = 0;
  while (k == 0) k = random_u32();  // the kernel's CSPRNG: keys a peer cannot predict
  return k;
}

OfiHandle<fid_mr> OfiTransport::register_mr(size_t rail, uint8_t* addr, uint64_t length,
                                            uint32_t access, uint32_t* key, int cuda_device) {
  for (int attempt = 1;; ++attempt) {
    *key = random_key();
    try {
      return domains_.at(rail)->register_memory(addr, length, access, key, cuda_device);
    } catch (const Error& e) {
      // A key of our choosing already in use (FI_ENOKEY): pick another.
      if (e.err_no() != FI_ENOKEY || attempt == kKeyTries) throw;
    }
  }
}

std::shared_ptr<MemoryRegion> OfiTransport::make_region(uint8_t* addr, uint64_t length,
                                                        uint32_t access,
                                                        std::unique_ptr<PinnedAllocation> owned) {
  check_mapped(addr, length);
  return region_on_rails(addr, length, access, std::move(owned), -1);
}

std::shared_ptr<MemoryRegion> OfiTransport::region_on_rails(
    uint8_t* addr, uint64_t length, uint32_t access, std::unique_ptr<PinnedAllocation> owned,
    int cuda_device) {
  std::vector<OfiRegion::RailMr> mrs;
  for (size_t rail = 0; rail < domains_.size(); ++rail) {
    OfiRegion::RailMr m;
    m.domain = domains_[rail];
    m.mr = register_mr(rail, addr, length, access, &m.key, cuda_device);
    mrs.push_back(std::move(m));
  }
  return std::make_shared<OfiRegion>(addr, length, access, std::move(owned), std::move(mrs));
}

std::shared_ptr<MemoryRegion> OfiTransport::make_device_region(uint8_t* addr, uint64_t length,
                                                               uint32_t access, int dmabuf_fd,
                                                               uint64_t dmabuf_offset) {
  if (!capabilities().gpu_direct) {
    return Transport::make_device_region(addr, length, access, dmabuf_fd, dmabuf_offset);
  }
  const PointerInfo where = pointer_info(reinterpret_cast<uint64_t>(addr));
  if (where.kind != PointerKind::kDevice || where.device < 0) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string("GPU registration over ofi: the address is ") +
                    pointer_kind_name(where.kind) + " memory, not CUDA device memory");
  }
  return region_on_rails(addr, length, access, nullptr, where.device);
}

uint32_t OfiTransport::add_grant(std::weak_ptr<OfiChannel> channel, size_t rail) {
  constexpr uint32_t kRailMask = (1u << kOfiRailBits) - 1;
  // Unguessable (a peer cannot notify another's grant) but for the rail in its low bits.
  const uint32_t rail_bits = static_cast<uint32_t>(rail) & kRailMask;
  std::lock_guard<std::mutex> lock(grants_mu_);
  uint32_t t = (random_key() & ~kRailMask) | rail_bits;
  while (t == 0 || grants_.count(t) != 0) t = ((t * 2654435761u + 8) & ~kRailMask) | rail_bits;
  grants_[t] = std::move(channel);
  return t;
}

void OfiTransport::drop_grant(uint32_t token) {
  std::lock_guard<std::mutex> lock(grants_mu_);
  grants_.erase(token);
}

void OfiTransport::on_remote_data(uint32_t token) {
  std::shared_ptr<OfiChannel> channel;
  {
    std::lock_guard<std::mutex> lock(grants_mu_);
    auto it = grants_.find(token);
    if (it == grants_.end()) return;  // released meanwhile, or not a grant of ours
    channel = it->second.lock();
  }
  if (channel) channel->on_landed(token);
}

std::shared_ptr<OfiChannel> OfiTransport::handshake(UniqueFd fd, std::unique_ptr<TlsSession> tls,
                                                    const std::string& peer,
                                                    const Deadline& deadline, bool connector) {
  OfiEndpointRecord ours;
  ours.max_msg = UINT64_MAX;
  for (const auto& d : domains_) {
    ours.addresses.push_back(d->address());
    ours.max_msg = std::min(ours.max_msg, d->settings().max_msg_size);
  }
  ours.provider = domains_[0]->settings().provider;
  const std::string rec = ours.pack();
  send_exact(fd.get(), rec.data(), rec.size(), deadline,
             "ofi handshake: sending the endpoint record", tls.get());
  const OfiEndpointRecord theirs = read_record(fd.get(), tls.get(), deadline);
  if (theirs.provider != ours.provider) {
    throw Error(ErrorKind::kConnection,
                "ofi handshake: the peer uses provider " + theirs.provider + ", this engine " +
                    ours.provider + "; set RDMAXFER_OFI_PROVIDER to the same on both sides");
  }
  // Rail i with the peer's rail i, as many as both have.
  const size_t n = std::min(domains_.size(), theirs.addresses.size());
  std::vector<OfiPeerRail> rails;
  for (size_t i = 0; i < n; ++i) {
    rails.push_back(OfiPeerRail{domains_[i], domains_[i]->peer(theirs.addresses[i])});
  }
  const uint8_t ready = OfiEndpointRecord::kReadyByte;
  send_exact(fd.get(), &ready, 1, deadline, "ofi handshake: sending READY", tls.get());
  uint8_t got = 0;
  recv_exact(fd.get(), &got, 1, deadline, "ofi handshake: waiting for the peer's READY",
             tls.get());
  if (got != OfiEndpointRecord::kReadyByte) {
    throw Error(ErrorKind::kProtocol,
                "ofi handshake: the peer sent " + std::to_string(got) + " instead of READY");
  }
  auto channel = std::make_shared<OfiChannel>(*this, std::move(rails), std::move(fd),
                                              std::move(tls), theirs.max_msg, peer, connector);
  attach_protocol(channel);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) throw Error(ErrorKind::kClosed, "the engine is closed");
    channels_.erase(std::remove_if(channels_.begin(), channels_.end(),
                                   [](const auto& w) { return w.expired(); }),
                    channels_.end());
    channels_.push_back(channel);
  }
  channel->start();
  return channel;
}

uint16_t OfiTransport::listen(const std::string& host, uint16_t port) {
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

void OfiTransport::accept_group(AcceptedGroup group) {
  const std::string peer = group.peer;
  try {
    std::unique_ptr<TlsSession> tls = group.tls.empty() ? nullptr : std::move(group.tls[0]);
    auto channel = handshake(std::move(group.fds[0]), std::move(tls), peer,
                             Deadline(kOfiAcceptHandshakeS), false);
    channel->set_peer_engine(group.hello.engine_id);
    log_accepted(*channel);
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    accepted_.push_back(std::move(channel));
    accepted_cv_.notify_all();
  } catch (const Error& e) {
    bool closing = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing = shut_down_;
    }
    if (!closing) accept_failed(peer, std::string("ofi handshake: ") + e.what());
  }
}

std::shared_ptr<Channel> OfiTransport::accept(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!acceptor_) throw Error(ErrorKind::kInvalidArgument, "accept: call listen() first");
  if (!wait_interruptible(accepted_cv_, lock, Deadline(timeout_s),
                          [this] { return !accepted_.empty() || shut_down_; })) {
    throw Error(ErrorKind::kTimeout, accept_timeout_text(timeout_s, acceptor_->port()));
  }
  if (shut_down_) throw Error(ErrorKind::kClosed, "accept: the engine is closed");
  auto channel = std::move(accepted_.front());
  accepted_.pop_front();
  return channel;
}

std::shared_ptr<Channel> OfiTransport::connect(const std::string& host, uint16_t port,
                                               const ConnectOptions& options) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) throw Error(ErrorKind::kClosed, "connect: the engine is closed");
  }
  Deadline deadline(options.timeout_s);
  SocketOptions sockets = bootstrap_options();
  sockets.retry_refused = options.retry_refused;
  const std::string peer = host_port(host, port);
  return counted_connect(
      peer,
      [&](int* retries) {
        uint64_t peer_engine = 0;
        std::vector<std::unique_ptr<TlsSession>> tls;
        std::vector<UniqueFd> fds =
            bootstrap_connect(host, port, declared().wire_id, 1, engine_id(), random_u64(),
                              sockets, deadline, retries, &peer_engine, &tls);
        auto channel = handshake(std::move(fds[0]), tls.empty() ? nullptr : std::move(tls[0]),
                                 peer, deadline, true);
        channel->set_peer_engine(peer_engine);
        return std::static_pointer_cast<Channel>(channel);
      },
      options.probe);
}

void OfiTransport::shutdown() {
  std::unique_ptr<Acceptor> acceptor;
  std::vector<std::weak_ptr<OfiChannel>> channels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    acceptor = std::move(acceptor_);
    channels.swap(channels_);
    accepted_.clear();
    accepted_cv_.notify_all();
    watch_cv_.notify_all();
  }
  connects_->cancel();
  acceptor.reset();
  for (auto& weak : channels) {
    if (auto c = weak.lock()) c->abort(ErrorKind::kClosed, "the engine is closed");
  }
  std::thread watch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    watch = std::move(watch_);
  }
  if (watch.joinable()) {
    if (watch.get_id() == std::this_thread::get_id()) {
      watch.detach();  // the watch dropped the engine's last holder: it ends by itself
    } else {
      watch.join();
    }
  }
  for (auto& domain : domains_) domain->stop();
}

void OfiTransport::watch_rails() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_ || watch_.joinable()) return;
  watch_ = std::thread([this] { rail_watch(); });
}

void OfiTransport::rail_watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shut_down_) {
    watch_cv_.wait_for(lock, std::chrono::duration<double>(kRailWatchS),
                       [this] { return shut_down_; });
    if (shut_down_) return;
    std::vector<std::shared_ptr<OfiChannel>> live;
    for (const auto& weak : channels_) {
      if (auto c = weak.lock()) live.push_back(std::move(c));
    }
    lock.unlock();
    for (const auto& c : live) c->heal_tick();
    live.clear();  // a channel dropped meanwhile closes here, outside the lock
    lock.lock();
  }
}

std::shared_ptr<MemoryRegion> OfiTransport::probe_region(uint64_t length) {
  auto owned = std::make_unique<PinnedAllocation>(length);
  uint8_t* data = owned->data();
  return region_on_rails(data, length, kAccessLocalWrite | kAccessRemoteRead, std::move(owned),
                         -1);
}

}  // namespace rdmaxfer
