// The engine: one transport, its registrations and connections, and the completion notifier
// that event loops watch.
//
// Lifecycle: constructed (transport threads running) -> used -> close(): the transport shuts
// down (connections aborted, threads joined). Every call after close() raises a closed error.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "engine/notifier.h"
#include "transport/registry.h"

namespace rdmaxfer {

class Engine {
 public:
  Engine(const std::string& transport, const TransportConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Transport& transport();
  const std::string& transport_name() const { return transport_name_; }
  uint64_t engine_id() const { return engine_id_; }
  const std::shared_ptr<Notifier>& notifier() const { return notifier_; }
  void close();
  bool closed() const { return closed_.load(); }

 private:
  std::string transport_name_;
  uint64_t engine_id_;
  std::unique_ptr<Transport> transport_;
  std::shared_ptr<Notifier> notifier_;
  std::atomic<bool> closed_{false};
};

}  // namespace rdmaxfer
