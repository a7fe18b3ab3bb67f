#include "engine/wireup.h"

#include <algorithm>
#include <cerrno>
#include <utility>

#include "common/deadline.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/socket.h"

namespace rdmaxfer {

namespace {

// accept() looks at each listener for this long in turn (it waits on both at once this way,
// the transports having no shared wait).
constexpr double kAcceptSliceS = 0.005;

bool is_timeout(const Error& e) { return e.kind() == ErrorKind::kTimeout; }

}  // namespace

Wireup::Wireup(Transport& network, Transport* shm, std::string shm_off)
    : network_(network), shm_(shm), shm_off_(std::move(shm_off)) {}

std::string Wireup::shm_off() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shm_off_;
}

Link Wireup::network_link(std::shared_ptr<Channel> channel, std::string note) const {
  return Link{std::move(channel), network_.capabilities().name,
              std::move(note)};
}

uint16_t Wireup::listen(const std::string& host, uint16_t port) {
  const uint16_t bound = network_.listen(host, port);
  if (shm_ == nullptr) return bound;
  try {
    shm_->listen(host, bound);
    std::lock_guard<std::mutex> lock(mu_);
    shm_listening_ = true;
    port_ = bound;
  } catch (const Error& e) {
    // Same-host peers still connect, over the network transport.
    log::write(log::Level::kInfo, std::string("transport auto: no shm listener on port ") +
                                      std::to_string(bound) + ": " + e.what() +
                                      "; same-host peers connect over " +
                                      network_.capabilities().name);
    std::lock_guard<std::mutex> lock(mu_);
    shm_off_ = std::string("no shm listener: ") + e.what();
  }
  return bound;
}

Link Wireup::accept(double timeout_s) {
  bool both = false;
  uint16_t port = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    both = shm_listening_;
    port = port_;
  }
  if (!both) return network_link(network_.accept(timeout_s), shm_off());
  const Deadline deadline(timeout_s);
  for (;;) {
    try {
      return Link{shm_->accept(kAcceptSliceS), shm_->capabilities().name, ""};
    } catch (const Error& e) {
      if (!is_timeout(e)) throw;
    }
    try {
      return network_link(network_.accept(kAcceptSliceS), "");
    } catch (const Error& e) {
      if (!is_timeout(e)) throw;
      if (deadline.expired()) {
        throw Error(ErrorKind::kTimeout, network_.accept_timeout_text(timeout_s, port));
      }
    }
  }
}

Link Wireup::connect(const std::string& host, uint16_t port, const ConnectOptions& options) {
  if (shm_ == nullptr) return network_link(network_.connect(host, port, options), shm_off());
  const Deadline deadline(options.timeout_s);
  ConnectOptions probe = options;
  probe.retry_refused = false;
  probe.probe = true;
  // The network connect gets what the probe left of the timeout.
  ConnectOptions rest = options;
  auto left = [&] {
    rest.timeout_s = std::max(0.001, deadline.remaining_ms() / 1000.0);
    return rest;
  };
  std::string why;
  try {
    return Link{shm_->connect(host, port, probe), shm_->capabilities().name, ""};
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kInvalidArgument) throw;  // a bad host: the same over TCP
    // EADDRNOTAVAIL: not an address of this machine, an ordinary peer on another host.
    // Otherwise the peer is here and shm was refused (another user or namespace, CMA
    // forbidden) or nobody takes shm connections on that port: say why.
    if (e.kind() == ErrorKind::kUnsupported && e.err_no() == EADDRNOTAVAIL) {
      return network_link(network_.connect(host, port, left()),
                          "shm not used: the peer is on another host");
    }
    why = e.kind() == ErrorKind::kConnection && e.err_no() != 0
              ? "the peer takes no shm connections on port " + std::to_string(port) +
                    " (it runs transport='tcp' or 'rdma', runs in another network namespace, or "
                    "was not listening yet)"
              : std::string(e.what());
  }
  const std::string network = network_.capabilities().name;
  log::write(log::Level::kInfo, "transport auto: " + host_port(host, port) +
                                    " is on this host but shm is not used (" + why +
                                    "); connecting over " + network);
  return network_link(network_.connect(host, port, left()), "shm not used: " + why);
}

}  // namespace rdmaxfer
