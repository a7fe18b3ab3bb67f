#include "transport/transport.h"

#include "common/deadline.h"
#include "common/error.h"
#include "core/transport_ids.h"

namespace rdmaxfer {

log::Level connection_end_level(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kClosed: return log::Level::kDebug;
    case ErrorKind::kConnection:
    case ErrorKind::kTimeout: return log::Level::kWarning;
    default: return log::Level::kError;
  }
}

std::shared_ptr<Channel> Transport::counted_connect(
    const std::string& peer,
    const std::function<std::shared_ptr<Channel>(int* retries)>& attempt, bool probe) {
  int retries = 0;
  std::shared_ptr<Channel> conn;
  try {
    conn = attempt(&retries);
  } catch (const Error& e) {
    if (!probe) {
      for (int i = 0; i < retries; ++i) stats_->add_retry();
      stats_->add_error("connect");
    }
    const log::Level level = probe || e.kind() == ErrorKind::kInvalidArgument
                                 ? log::Level::kDebug
                                 : log::Level::kWarning;
    if (log::enabled(level)) {
      log::write(level, "connect to " + peer + " failed (" + error_kind_name(e.kind()) +
                            "): " + e.what());
    }
    throw;
  }
  conn->count_retries(retries);
  if (log::enabled(log::Level::kDebug)) {
    log::write(log::Level::kDebug, std::string("endpoint connected over ") +
                                       capabilities().name + ": " +
                                       conn->describe() + ", after " +
                                       std::to_string(retries) + " retried attempt(s)");
  }
  return conn;
}

void Transport::log_accepted(const Channel& conn) const {
  if (owner_ != nullptr) {
    owner_->log_accepted(conn);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(refusals_mu_);
    refusals_ = Refusals{};
  }
  if (log::enabled(log::Level::kDebug)) {
    log::write(log::Level::kDebug, std::string("endpoint accepted over ") +
                                       capabilities().name + ": " +
                                       conn.describe());
  }
}

void Transport::accept_failed(const std::string& peer, const std::string& cause) const {
  stats_->add_error("accept");
  log::write(log::Level::kWarning, "incoming connection from " + peer + " refused: " + cause);
  const Transport& root = owner_ != nullptr ? *owner_ : *this;
  std::lock_guard<std::mutex> lock(root.refusals_mu_);
  ++root.refusals_.count;
  root.refusals_.peer = peer;
  root.refusals_.cause = cause;
}

std::string Transport::accept_timeout_text(double timeout_s, uint16_t port) const {
  if (owner_ != nullptr) return owner_->accept_timeout_text(timeout_s, port);
  Refusals refused;
  {
    std::lock_guard<std::mutex> lock(refusals_mu_);
    refused = refusals_;
  }
  const std::string within = seconds_text(timeout_s) + " s";
  if (refused.count == 0) {
    return "accept: no peer connected within " + within +
           "; raise timeout= or check that the peer connects to port " + std::to_string(port);
  }
  const std::string to_port = " to port " + std::to_string(port);
  if (refused.count == 1) {
    return "accept: no connection completed within " + within + ": a peer connected" + to_port +
           " but its handshake failed (" + refused.peer + ": " + refused.cause + ")";
  }
  return "accept: no connection completed within " + within + ": " +
         std::to_string(refused.count) + " connections" + to_port +
         " failed their handshake (the last, from " + refused.peer + ": " + refused.cause + ")";
}

std::shared_ptr<MemoryRegion> Transport::make_device_region(uint8_t*, uint64_t, uint32_t, int,
                                                            uint64_t) {
  throw Error(ErrorKind::kUnsupported,
              std::string("the ") + capabilities().name +
                  " transport moves bytes with the CPU and cannot register GPU memory; device "
                  "memory goes through staging (host bounce buffers)");
}

void Channel::check_peer_engine(const Descriptor& remote, const char* what) const {
  if (peer_engine_ == 0 || remote.engine_id == peer_engine_) return;
  throw Error(ErrorKind::kInvalidArgument,
              std::string(what) + ": the descriptor was made by the " +
                  transport_id_name(remote.transport) + " engine " +
                  engine_id_text(remote.engine_id) + ", but this endpoint connects to the engine " +
                  engine_id_text(peer_engine_) + " at " +
                  peer() + "; use a descriptor that engine made (its region.descriptor())");
}

std::string Channel::describe() const {
  return "to " + peer() + ", " + std::to_string(streams()) + " stream(s)";
}

void Transport::attach_protocol(const std::shared_ptr<Channel>& channel) const {
  if (!protocol_) {
    throw Error(ErrorKind::kInvalidArgument,
                "the transport has no protocol for its connections (set_protocol)");
  }
  channel->attach(protocol_(channel));
}

Descriptor Transport::describe_region(const MemoryRegion& region) const {
  Descriptor d;
  d.transport = capabilities().wire_id;
  d.access = region.access() & kAccessRemoteMask;
  d.addr = reinterpret_cast<uint64_t>(region.addr());
  d.length = region.length();
  // The generation before the keys: a device that comes back in between gives keys newer than
  // it says, which its peers then leave unused (never older ones taken for new).
  d.generation = key_generation();
  d.key = region.wire_key();
  d.rail_keys = region.rail_keys();
  d.engine_id = engine_id_;
  return d;
}

}  // namespace rdmaxfer
