// The transport interface: what the protocol and the engine need from TCP and from verbs alike.
//
// A Transport owns memory registration, listening and connecting; a Channel (one peer,
// channel.h) offers the primitives and returns Requests. The interface never names an
// implementation: the engine picks one through make_transport() (transport/registry.h).
//
// Matched lifecycle pairs: register_memory/alloc_pinned -> deregister; listen -> accept;
// connect/accept -> close (or abort); post_* -> Request terminal.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "core/descriptor.h"
#include "core/region.h"
#include "core/request.h"
#include "core/stats.h"
#include "transport/channel.h"

namespace rdmaxfer {

// How loudly a connection that ends with `kind` is logged: a local close at DEBUG, a lost peer
// or a timeout at WARNING, anything else (transport or protocol error) at ERROR.
log::Level connection_end_level(ErrorKind kind);

struct Capabilities {
  TransportKind kind = TransportKind::kTcp;
  bool one_sided = true;         // WRITE/READ into a peer's registered memory
  bool write_with_imm = false;   // WRITE that also notifies the target in hardware
  bool gpu_direct = false;       // registers device memory directly
  uint64_t max_message = 0;      // largest single transfer in bytes (0: unlimited)
};

// Makes the events target (the protocol) of a new channel, before the channel starts.
using ProtocolFactory =
    std::function<std::shared_ptr<ChannelEvents>(const std::shared_ptr<Channel>&)>;

struct ConnectOptions {
  int streams = 0;  // parallel streams (TCP) or QPs (verbs); 0: the transport's default
  double timeout_s = 10.0;
  bool retry_refused = true;  // retry a refused connection until the timeout (see socket.h)
};

class Transport {
 public:
  explicit Transport(uint64_t engine_id) : engine_id_(engine_id) {}
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  virtual Capabilities capabilities() const = 0;
  virtual std::string describe() const = 0;

  // Registers [addr, addr+length) with the given Access bits (remote rights, and
  // kAccessLocalWrite when local operations write it; remote write implies local write).
  std::shared_ptr<MemoryRegion> register_memory(uint8_t* addr, uint64_t length, uint32_t access);
  // Allocates page-aligned host memory, locks it (mlock) and registers it (always with local
  // write: the memory is the engine's own).
  std::shared_ptr<MemoryRegion> alloc_pinned(uint64_t length, uint32_t access);
  // Registers GPU memory for GPUDirect RDMA (cuda/gpudirect.h): through a dmabuf fd when
  // dmabuf_fd >= 0 (the range starts dmabuf_offset bytes into the exported pages), else by
  // address (nvidia-peermem). Transports whose CPU moves the bytes (TCP) throw
  // Error(kUnsupported): device memory goes through staging there (protocol/staging.h).
  std::shared_ptr<MemoryRegion> register_device_memory(uint8_t* addr, uint64_t length,
                                                       uint32_t access, int dmabuf_fd,
                                                       uint64_t dmabuf_offset);
  // Kills the region's key for new remote accesses, waits (bounded) for in-flight uses, then
  // revokes the region at once (verbs: ibv_dereg_mr), whoever still holds the object. On a
  // timeout (Error kTimeout) the region stays registered with the transport's handle alive.
  void deregister(const std::shared_ptr<MemoryRegion>& region, double timeout_s);
  Descriptor describe_region(const MemoryRegion& region) const;
  size_t registered_count() const { return regions_.size(); }
  const RegionTable& regions() const { return regions_; }

  virtual uint16_t listen(const std::string& host, uint16_t port) = 0;
  virtual std::shared_ptr<Channel> accept(double timeout_s) = 0;
  virtual std::shared_ptr<Channel> connect(const std::string& host, uint16_t port,
                                           const ConnectOptions& options) = 0;
  // Aborts every connection and stops the transport's threads.
  virtual void shutdown() = 0;

  uint64_t engine_id() const { return engine_id_; }
  // The engine's counters: every connection's, plus set-ups that failed (core/stats.h).
  const std::shared_ptr<Stats>& stats() const { return stats_; }
  uint64_t next_request_id() { return next_request_id_.fetch_add(1); }
  // Set once by the engine, before any connection (protocol/connection.h).
  void set_protocol(ProtocolFactory factory) { protocol_ = std::move(factory); }

 protected:
  // Runs a connect to `peer` through `attempt` (which counts refused, retried tries in
  // *retries): counts the retries, logs and counts ("errors.connect") a failure before
  // rethrowing it, and logs the new endpoint at DEBUG.
  std::shared_ptr<Channel> counted_connect(
      const std::string& peer,
      const std::function<std::shared_ptr<Channel>(int* retries)>& attempt);
  // Logs an accepted endpoint at DEBUG.
  void log_accepted(const Channel& channel) const;
  // Logs (WARNING) and counts ("errors.accept") an incoming connection from `peer` whose
  // set-up failed.
  void accept_failed(const std::string& peer, const std::string& cause) const;

  // Builds the transport's region object (a verbs MR, or plain bookkeeping on TCP).
  virtual std::shared_ptr<MemoryRegion> make_region(uint8_t* addr, uint64_t length,
                                                    uint32_t access,
                                                    std::unique_ptr<PinnedAllocation> owned) = 0;
  // The device-memory twin of make_region; the default refuses (kUnsupported).
  virtual std::shared_ptr<MemoryRegion> make_device_region(uint8_t* addr, uint64_t length,
                                                           uint32_t access, int dmabuf_fd,
                                                           uint64_t dmabuf_offset);
  // Gives a new channel its protocol; throws when the engine set none.
  void attach_protocol(const std::shared_ptr<Channel>& channel) const;
  RegionTable regions_;

 private:
  ProtocolFactory protocol_;
  const uint64_t engine_id_;
  const std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
  std::atomic<uint64_t> next_request_id_{1};
};

}  // namespace rdmaxfer
