// The transport interface: what the protocol and the engine need from TCP and from verbs alike.
//
// A Transport owns listening and connecting, and its MemoryDomain (memory_domain.h: every
// registration); a Channel (one peer, channel.h) offers the primitives and returns Requests. The interface never names an
// implementation: the engine picks one through make_transport() (transport/registry.h).
//
// Matched lifecycle pairs: listen -> accept;
// connect/accept -> close (or abort); post_* -> Request terminal.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "core/descriptor.h"
#include "core/region.h"
#include "core/request.h"
#include "core/stats.h"
#include "transport/channel.h"
#include "transport/memory_domain.h"

namespace rdmaxfer {

// How loudly a connection that ends with `kind` is logged: a local close at DEBUG, a lost peer
// or a timeout at WARNING, anything else (transport or protocol error) at ERROR.
log::Level connection_end_level(ErrorKind kind);

// What a transport declares about itself. Every choice that differs between transports (the
// descriptor's and hello's id, automatic selection, the same-host companion, how GPU memory
// registers or stages, what info/doctor list) is made from these, never from a name.
struct Capabilities {
  std::string name;            // what Engine(transport=...) takes ("tcp")
  uint8_t wire_id = 0;         // in descriptors and hellos (core/transport_ids.h); never reused
  bool listed = true;          // offered to users (available_transports); false: internal
  bool network = true;         // reaches other hosts; false: processes on this host only
  int auto_rank = 0;           // transport="auto" takes the usable network transport of highest
                               // rank; 0: never picked automatically
  bool same_host_companion = false;  // serves a network transport's registrations for
                                     // same-host peers (transport="auto", engine/wireup.h)
  bool bootstrap = true;       // connections start with the socket bootstrap's Hello
  bool one_sided = true;       // WRITE/READ into a peer's registered memory
  bool write_with_imm = false; // WRITE that also notifies the target in hardware
  bool gpu_direct = false;     // the NIC reads and writes device memory (dmabuf or peermem MRs)
  bool device_ipc = false;     // exports device memory to same-host peers (CUDA IPC)
  bool rails = false;          // runs on named devices, one per rail (Transport::rails)
  bool tls = false;            // its bootstrap streams, and whatever it sends over them, can
                               // run under TLS 1.3 (transport/tls.h; settings "<name>.tls")
  uint64_t max_message = 0;    // largest single transfer in bytes (0: unlimited)
};

// Makes the events target (the protocol) of a new channel, before the channel starts.
using ProtocolFactory =
    std::function<std::shared_ptr<ChannelEvents>(const std::shared_ptr<Channel>&)>;

struct ConnectOptions {
  int streams = 0;  // parallel streams (TCP) or QPs (verbs); 0: the transport's default
  double timeout_s = 10.0;
  bool retry_refused = true;  // retry a refused connection until the timeout (see socket.h)
  // A failure is an answer, not an error (transport="auto" asking whether shm reaches the
  // peer, engine/wireup.h): logged at DEBUG and not counted in "errors.connect".
  bool probe = false;
};

class Transport : public RegistrationBackend {
 public:
  explicit Transport(uint64_t engine_id) : domain_(*this), engine_id_(engine_id) {}
  // A companion of `owner` in one engine (engine/wireup.h): it serves owner's registrations
  // (domain() is owner's), counts into owner's stats and draws owner's request ids, so a peer
  // names the same region whichever of the two carries its connection. `owner` outlives it.
  explicit Transport(Transport& owner)
      : domain_(*this), owner_(&owner), engine_id_(owner.engine_id_), stats_(owner.stats_) {}
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  virtual Capabilities capabilities() const = 0;
  // The devices the transport runs on, in rail order (verbs: one per rail); empty elsewhere.
  virtual std::vector<std::string> rails() const { return {}; }
  virtual std::string describe() const = 0;
  // Levels of what the transport holds now, by name (Engine.stats adds them to its counters):
  // on verbs the receive buffers posted and allocated; none elsewhere.
  virtual std::vector<std::pair<std::string, uint64_t>> gauges() const { return {}; }
  // Why this engine's transport does not register GPU memory with its NIC although its kind
  // may (ofi: the provider granted no FI_HMEM); "" where capabilities() say why (gpu_direct).
  virtual std::string gpu_direct_off() const { return ""; }

  // Every registration of this transport (register, alloc_pinned, device memory, deregister).
  MemoryDomain& domain() { return owner_ != nullptr ? owner_->domain() : domain_; }
  const MemoryDomain& domain() const { return owner_ != nullptr ? owner_->domain() : domain_; }
  Descriptor describe_region(const MemoryRegion& region) const;
  // How many times one of this transport's devices came back since it started (the
  // descriptor's generation, core/descriptor.h); 0 where none can.
  virtual uint16_t key_generation() const { return 0; }

  virtual uint16_t listen(const std::string& host, uint16_t port) = 0;
  virtual std::shared_ptr<Channel> accept(double timeout_s) = 0;
  virtual std::shared_ptr<Channel> connect(const std::string& host, uint16_t port,
                                           const ConnectOptions& options) = 0;
  // Aborts every connection and stops the transport's threads.
  virtual void shutdown() = 0;

  uint64_t engine_id() const { return engine_id_; }
  // The engine's counters: every connection's, plus set-ups that failed (core/stats.h).
  const std::shared_ptr<Stats>& stats() const { return stats_; }
  uint64_t next_request_id() {
    return owner_ != nullptr ? owner_->next_request_id() : next_request_id_.fetch_add(1);
  }
  // Set once by the engine, before any connection (protocol/connection.h).
  void set_protocol(ProtocolFactory factory) { protocol_ = std::move(factory); }
  // The message of an accept that waited `timeout_s` for a peer on `port` in vain: no peer
  // connected, or peers connected and their set-up failed since the last accepted one (how
  // many, and the last one's address and cause: a wrong secret, say). Shared with the owner.
  std::string accept_timeout_text(double timeout_s, uint16_t port) const;

 protected:
  // RegistrationBackend: make_region is the transport's; device memory is refused by default
  // (kUnsupported: the CPU moves the bytes, so device memory goes through staging).
  std::shared_ptr<MemoryRegion> make_device_region(uint8_t* addr, uint64_t length,
                                                   uint32_t access, int dmabuf_fd,
                                                   uint64_t dmabuf_offset) override;
  // Runs a connect to `peer` through `attempt` (which counts refused, retried tries in
  // *retries): counts the retries, logs and counts ("errors.connect") a failure before
  // rethrowing it, and logs the new endpoint at DEBUG.
  // With `probe` (ConnectOptions::probe) a failure is logged at DEBUG and not counted.
  std::shared_ptr<Channel> counted_connect(
      const std::string& peer,
      const std::function<std::shared_ptr<Channel>(int* retries)>& attempt, bool probe = false);
  // Logs an accepted endpoint at DEBUG (and forgets the refusals before it).
  void log_accepted(const Channel& channel) const;
  // Logs (WARNING) and counts ("errors.accept") an incoming connection from `peer` whose
  // set-up failed, and keeps it for accept_timeout_text.
  void accept_failed(const std::string& peer, const std::string& cause) const;

  // Gives a new channel its protocol; throws when the engine set none.
  void attach_protocol(const std::shared_ptr<Channel>& channel) const;

 private:
  MemoryDomain domain_;
  Transport* const owner_ = nullptr;
  ProtocolFactory protocol_;
  const uint64_t engine_id_;
  const std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
  std::atomic<uint64_t> next_request_id_{1};
  // Incoming connections refused since the last accepted one: how many, the last one's
  // peer and cause (the owner's, for a companion).
  struct Refusals {
    uint64_t count = 0;
    std::string peer;
    std::string cause;
  };
  mutable std::mutex refusals_mu_;
  mutable Refusals refusals_;
};

}  // namespace rdmaxfer
