#include "engine/engine.h"

#include <random>

#include "common/error.h"

namespace rdmaxfer {

namespace {
uint64_t random_engine_id() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}
}  // namespace

Engine::Engine(const std::string& transport, const TransportConfig& config)
    : transport_name_(transport),
      engine_id_(random_engine_id()),
      transport_(make_transport(transport, engine_id_, config)),
      notifier_(std::make_shared<Notifier>()) {}

Engine::~Engine() { close(); }

Transport& Engine::transport() {
  if (closed_.load()) {
    throw Error(ErrorKind::kClosed, "the engine is closed; create a new Engine");
  }
  return *transport_;
}

void Engine::close() {
  if (closed_.exchange(true)) return;
  transport_->shutdown();
}

}  // namespace rdmaxfer
