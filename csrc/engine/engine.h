// The engine: its transport (with transport="auto" a network transport plus a same-host shm
// companion, picked per connection by the Wireup, engine/wireup.h), its registrations and
// connections, and the completion notifier that event loops watch.
//
// Lifecycle: constructed (transport threads running) -> used -> close(): the transport shuts
// down (connections aborted, threads joined). Every call after close() raises a closed error.
// In a child of fork() an engine created before the fork is inert (common/fork_guard.h):
// transport() raises, close() and the destructor leave the parent's transport untouched.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "core/notifier.h"
#include "engine/wireup.h"
#include "protocol/notifications.h"
#include "transport/registry.h"

namespace rdmaxfer {

class Engine {
 public:
  // `transport`: "tcp", "rdma", "ofi", "shm", or "auto" (rdma where a device offers RC, else
  // ofi over a hardware RDMA provider, else tcp; shm for same-host peers when it can run here).
  Engine(const std::string& transport, const TransportConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The transport that holds the registrations (with "auto": the network transport).
  Transport& transport();
  const std::string& transport_name() const { return transport_name_; }
  // The transport that registers GPU memory by `method` (transport/gpu_registration.h):
  // "cuda_ipc" on an automatic engine over TCP is its shm companion (exporting into the
  // network transport's domain, so one key names the region on either kind of connection);
  // else transport(). Throws Error(kUnsupported) for "cuda_ipc" on an automatic engine
  // without a companion or over rdma (GPU memory is registered for GPUDirect RDMA there).
  Transport& gpu_registrar(const std::string& method);
  // Listening and connecting pick each connection's transport (wireup.h).
  Wireup& wireup();
  // True for transport="auto".
  bool automatic() const { return automatic_; }
  // With transport="auto", why it took its network transport (registry.h); else "".
  const std::string& auto_why() const { return auto_.why; }
  // True when an automatic engine has its same-host shm companion.
  bool has_shm_companion() const { return shm_ != nullptr; }
  uint64_t engine_id() const { return engine_id_; }
  const std::shared_ptr<Notifier>& notifier() const { return notifier_; }
  // The notifications peers sent with their WRITEs, from every connection (closed with the
  // engine).
  NotificationQueue& notifications() { return *notifications_; }
  // The counters of every connection the engine made, and of failed set-ups; readable after
  // close().
  const Stats& stats() const { return *stats_; }
  // The transport's levels now (Transport::gauges); none once closed or in a child of fork().
  std::vector<std::pair<std::string, uint64_t>> gauges() const;
  void close();
  bool closed() const { return closed_.load(); }

 private:
  AutoChoice auto_;  // the forced transport with no why, or auto's choice
  std::string transport_name_;
  uint64_t engine_id_;
  bool automatic_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Transport> shm_;  // the same-host companion (transport="auto")
  std::unique_ptr<Wireup> wireup_;
  std::shared_ptr<Stats> stats_;
  std::shared_ptr<Notifier> notifier_;
  std::shared_ptr<NotificationQueue> notifications_;
  std::atomic<bool> closed_{false};
  uint64_t fork_generation_;  // an engine from before a fork() is inert in the child
};

}  // namespace rdmaxfer
