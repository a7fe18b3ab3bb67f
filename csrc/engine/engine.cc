#include "engine/engine.h"

#include <random>

#include "common/error.h"
#include "common/fork_guard.h"
#include "protocol/connection.h"

namespace rdmaxfer {

namespace {
constexpr double kPoolCloseS = 5.0;  // bound on each bounce slab's deregistration at close

uint64_t random_engine_id() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}
}  // namespace

Engine::Engine(const std::string& transport, const TransportConfig& config)
    : transport_name_(transport),
      engine_id_(random_engine_id()),
      transport_(make_transport(transport, engine_id_, config)),
      stats_(transport_->stats()),
      notifier_(std::make_shared<Notifier>()),
      notifications_(std::make_shared<NotificationQueue>()),
      fork_generation_(fork_generation()) {
  transport_->set_protocol([queue = notifications_](const std::shared_ptr<Channel>& channel) {
    return make_message_protocol(channel, queue);
  });
}

Engine::~Engine() { close(); }

Transport& Engine::transport() {
  if (fork_generation_ != fork_generation()) {
    throw Error(ErrorKind::kClosed, inherited_text("this Engine"));
  }
  if (closed_.load()) {
    throw Error(ErrorKind::kClosed, "the engine is closed; create a new Engine");
  }
  return *transport_;
}

void Engine::close() {
  if (closed_.exchange(true)) return;
  if (fork_generation_ != fork_generation()) {
    // Inherited through fork(): the transport's threads are not here and its sockets, QPs and
    // MRs are the parent's. Never shut it down or destroy it in this process.
    static_cast<void>(transport_.release());
    return;
  }
  // The staging operations have ended (their Stagers are closed first): free the slabs while
  // the transport can still deregister them.
  transport_->domain().close_bounce_pool(kPoolCloseS);
  transport_->shutdown();
  notifications_->close();
}

}  // namespace rdmaxfer
