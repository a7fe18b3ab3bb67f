#include "engine/engine.h"

#include "common/error.h"
#include "common/fork_guard.h"
#include "common/log.h"
#include "common/random.h"
#include "protocol/connection.h"

namespace rdmaxfer {

namespace {
constexpr double kPoolCloseS = 5.0;  // bound on each bounce slab's deregistration at close

// "auto": the usable network transport of highest rank (Capabilities::auto_rank).
AutoChoice network_choice(const std::string& transport) {
  return transport == "auto" ? automatic_network_transport() : AutoChoice{transport, ""};
}
}  // namespace

Engine::Engine(const std::string& transport, const TransportConfig& config)
    : auto_(network_choice(transport)),
      transport_name_(auto_.name),
      engine_id_(random_u64()),
      automatic_(transport == "auto"),
      transport_(make_transport(transport_name_, engine_id_, config)),
      stats_(transport_->stats()),
      notifier_(std::make_shared<Notifier>()),
      notifications_(std::make_shared<NotificationQueue>()),
      fork_generation_(fork_generation()) {
  const ProtocolFactory protocol = [queue = notifications_, bound = config.max_message_bytes](
                                       const std::shared_ptr<Channel>& channel) {
    return make_message_protocol(channel, queue, bound);
  };
  transport_->set_protocol(protocol);
  std::string shm_off;  // forced transport: shm is not in question
  if (automatic_) {
    try {
      shm_ = make_same_host_companion(*transport_, config);
      shm_->set_protocol(protocol);
    } catch (const Error& e) {
      shm_off = e.what();
      log::write(log::Level::kInfo, "transport auto: same-host peers connect over " +
                                        transport_name_ + ": " + shm_off);
    }
  }
  wireup_ = std::make_unique<Wireup>(*transport_, shm_.get(), shm_off);
}

Engine::~Engine() { close(); }

std::vector<std::pair<std::string, uint64_t>> Engine::gauges() const {
  if (fork_generation_ != fork_generation() || closed_.load()) return {};
  return transport_->gauges();
}

Transport& Engine::transport() {
  if (fork_generation_ != fork_generation()) {
    throw Error(ErrorKind::kClosed, inherited_text("this Engine"));
  }
  if (closed_.load()) {
    throw Error(ErrorKind::kClosed, "the engine is closed; create a new Engine");
  }
  return *transport_;
}

Transport& Engine::gpu_registrar(const std::string& method) {
  Transport& network = transport();  // raises when closed or inherited through fork()
  if (!automatic_ || method != "cuda_ipc") return network;
  if (shm_ == nullptr) {
    throw Error(ErrorKind::kUnsupported,
                "GPU registration by CUDA IPC: this engine has no shm companion (" +
                    wireup_->shm_off() + ")");
  }
  if (network.capabilities().gpu_direct) {
    throw Error(ErrorKind::kUnsupported,
                "GPU registration by CUDA IPC: an automatic engine over " + transport_name_ +
                    " registers GPU memory for GPUDirect RDMA (dmabuf or nvidia-peermem)");
  }
  return *shm_;
}

Wireup& Engine::wireup() {
  transport();  // raises when closed or inherited through fork()
  return *wireup_;
}

void Engine::close() {
  if (closed_.exchange(true)) return;
  if (fork_generation_ != fork_generation()) {
    // Inherited through fork(): the transport's threads are not here and its sockets, QPs and
    // MRs are the parent's. Never shut it down or destroy it in this process.
    static_cast<void>(shm_.release());
    static_cast<void>(transport_.release());
    return;
  }
  // The staging operations have ended (their Stagers are closed first): free the slabs while
  // the transport can still deregister them.
  transport_->domain().close_bounce_pool(kPoolCloseS);
  if (shm_) shm_->shutdown();
  transport_->shutdown();
  notifications_->close();
}

}  // namespace rdmaxfer
