#include "transport/loopback/loopback_transport.h"

#include <map>

#include "common/deadline.h"
#include "common/error.h"
#include "transport/loopback/loopback_channel.h"

namespace rdmaxfer {

namespace {
// The loopback listeners of this process, by port.
std::mutex listeners_mu;
std::map<uint16_t, LoopbackTransport*>& listeners() {
  static std::map<uint16_t, LoopbackTransport*> table;
  return table;
}
constexpr uint16_t kFirstPort = 1024;
}  // namespace

LoopbackTransport::LoopbackTransport(uint64_t engine_id)
    : Transport(engine_id), thread_([this] { run(); }) {}

LoopbackTransport::~LoopbackTransport() { shutdown(); }

Capabilities LoopbackTransport::declared() {
  Capabilities c;
  c.name = "loopback";
  c.wire_id = 3;
  c.listed = false;  // tests only
  c.network = false;
  c.bootstrap = false;
  c.one_sided = true;
  return c;
}

std::string LoopbackTransport::describe() const {
  return "loopback (in-process test transport, memcpy)";
}

std::shared_ptr<MemoryRegion> LoopbackTransport::make_region(
    uint8_t* addr, uint64_t length, uint32_t access, std::unique_ptr<PinnedAllocation> owned) {
  return std::make_shared<MemoryRegion>(addr, length, access, std::move(owned));
}

void LoopbackTransport::run() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return shut_down_ || !queue_.empty(); });
      if (queue_.empty()) return;  // shut down and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

void LoopbackTransport::deliver(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return;
  queue_.push_back(std::move(fn));
  cv_.notify_all();
}

uint16_t LoopbackTransport::listen(const std::string& /*host*/, uint16_t port) {
  std::lock_guard<std::mutex> table_lock(listeners_mu);
  auto& table = listeners();
  if (port == 0) {
    port = kFirstPort;
    while (table.count(port) != 0) ++port;
  } else if (table.count(port) != 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "listen: loopback port " + std::to_string(port) + " is taken in this process");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) throw Error(ErrorKind::kClosed, "the engine is closed");
  if (port_ != 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "listen: this engine already listens on port " + std::to_string(port_));
  }
  port_ = port;
  table[port] = this;
  return port;
}

std::shared_ptr<LoopbackChannel> LoopbackTransport::make_channel(int lanes, std::string peer) {
  auto channel = std::make_shared<LoopbackChannel>(*this, lanes, std::move(peer));
  attach_protocol(channel);
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) throw Error(ErrorKind::kClosed, "the engine is closed");
  channels_.push_back(channel);
  return channel;
}

std::shared_ptr<Channel> LoopbackTransport::connect(const std::string& host, uint16_t port,
                                                    const ConnectOptions& options) {
  const int lanes = options.streams > 0 ? options.streams : 1;
  auto ours = make_channel(lanes, "loopback:" + std::to_string(port));
  std::lock_guard<std::mutex> table_lock(listeners_mu);
  auto it = listeners().find(port);
  if (it == listeners().end()) {
    throw Error(ErrorKind::kConnection, "connect: no loopback engine of this process listens on " +
                                            host + ":" + std::to_string(port));
  }
  LoopbackTransport& listener = *it->second;
  auto theirs = listener.make_channel(lanes, "loopback:client");
  ours->pair(theirs);
  theirs->pair(ours);
  ours->set_peer_engine(listener.engine_id());
  theirs->set_peer_engine(engine_id());
  std::lock_guard<std::mutex> lock(listener.mu_);
  listener.accepted_.push_back(theirs);
  listener.cv_.notify_all();
  return ours;
}

std::shared_ptr<Channel> LoopbackTransport::accept(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (port_ == 0) throw Error(ErrorKind::kInvalidArgument, "accept: call listen() first");
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                    [this] { return !accepted_.empty() || shut_down_; })) {
    throw Error(ErrorKind::kTimeout, "accept: no loopback peer connected within " +
                                         std::to_string(timeout_s) + " s");
  }
  if (shut_down_) throw Error(ErrorKind::kClosed, "accept: the engine is closed");
  auto channel = std::move(accepted_.front());
  accepted_.pop_front();
  return channel;
}

void LoopbackTransport::shutdown() {
  {
    std::lock_guard<std::mutex> table_lock(listeners_mu);
    std::lock_guard<std::mutex> lock(mu_);
    if (port_ != 0) listeners().erase(port_);
    port_ = 0;
  }
  std::vector<std::weak_ptr<LoopbackChannel>> channels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    channels.swap(channels_);
    accepted_.clear();
  }
  for (auto& w : channels) {
    if (auto c = w.lock()) c->abort(ErrorKind::kClosed, "the engine was closed");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace rdmaxfer
