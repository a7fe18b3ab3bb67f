// The transport interface: what the engine needs from TCP and from verbs alike.
//
// A Transport owns memory registration, listening and connecting; a Connection (one peer)
// posts operations and returns Requests. The interface never names an implementation: the
// engine picks one through make_transport() (transport/registry.h).
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
#include "core/stats.h"
#include "engine/descriptor.h"
#include "engine/region.h"
#include "engine/request.h"

namespace rdmaxfer {

// How loudly a connection that ends with `kind` is logged: a local close at DEBUG, a lost peer
// or a timeout at WARNING, anything else (transport or protocol error) at ERROR.
log::Level connection_end_level(ErrorKind kind);

struct Capabilities {
  TransportKind kind = TransportKind::kTcp;
  bool one_sided = true;         // WRITE/READ into a peer's registered memory
  bool write_with_imm = false;   // WRITE that also notifies the target
  bool gpu_direct = false;       // registers device memory directly
  uint64_t max_message = 0;      // largest single transfer in bytes (0: unlimited)
};

// Per-transfer knobs; 0 means "choose from the transfer size".
struct TransferOptions {
  uint64_t chunk_size = 0;  // bytes per wire chunk / work request
  int streams = 0;          // how many of the connection's streams (or QPs) to spread over
};

class Connection {
 public:
  // `engine_stats`: the engine's counters, which also receive every count of this connection.
  explicit Connection(std::shared_ptr<Stats> engine_stats = nullptr)
      : stats_(std::make_shared<Stats>(std::move(engine_stats))) {}
  virtual ~Connection() = default;

  // One-sided: copy `length` bytes between local[local_offset:] and the peer's region named by
  // `remote` at remote.addr + remote_offset. Completes when the bytes are placed remotely
  // (WRITE) or locally (READ).
  virtual RequestPtr post_write(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                                const Descriptor& remote, uint64_t remote_offset,
                                uint64_t length, const TransferOptions& options) = 0;
  virtual RequestPtr post_read(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                               const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                               const TransferOptions& options) = 0;

  // Two-sided: a message of `length` bytes with opaque `meta` (dtype, shape...). The receiver
  // first gets the header (post_recv_header), then places the bytes (post_recv) or refuses them
  // (reject), so a mismatch is caught before any byte is written.
  virtual RequestPtr post_send(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                               uint64_t length, const std::string& meta,
                               const TransferOptions& options) = 0;
  virtual RequestPtr post_recv_header() = 0;
  virtual RequestPtr post_recv(uint64_t msg_id, const std::shared_ptr<MemoryRegion>& local,
                               uint64_t offset, uint64_t length) = 0;
  virtual void reject(uint64_t msg_id, const std::string& reason) = 0;
  // Withdraws a header wait that has not matched a message yet; true when withdrawn.
  virtual bool cancel_recv_header(const RequestPtr& request) = 0;

  // Graceful close: tell the peer, fail what is still pending, release sockets/QPs.
  virtual void close() = 0;
  // Immediate teardown after an error or timeout: every pending request fails with `reason`.
  virtual void abort(ErrorKind kind, const std::string& reason) = 0;
  virtual bool is_closed() const = 0;
  virtual std::string error() const = 0;
  virtual std::string peer() const = 0;
  virtual int streams() const = 0;
  // One line naming the peer, the streams and what was negotiated with the peer.
  virtual std::string describe() const;
  // What was negotiated, by name (verbs: path_mtu in bytes, max_rd_atomic,
  // max_dest_rd_atomic, ...); empty where nothing is.
  virtual std::vector<std::pair<std::string, uint64_t>> attributes() const { return {}; }
  // This connection's counters (core/stats.h).
  const Stats& stats() const { return *stats_; }
  // Counts the refused attempts that the connect which made this connection retried.
  void count_retries(int retries) {
    for (int i = 0; i < retries; ++i) stats_->add_retry();
  }

 protected:
  // Shared with the requests and streams that count into it (they may outlive the connection).
  const std::shared_ptr<Stats> stats_;
};

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
  // Error(kUnsupported): device memory goes through staging there (cuda/staging.h).
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
  virtual std::shared_ptr<Connection> accept(double timeout_s) = 0;
  virtual std::shared_ptr<Connection> connect(const std::string& host, uint16_t port,
                                              const ConnectOptions& options) = 0;
  // Aborts every connection and stops the transport's threads.
  virtual void shutdown() = 0;

  uint64_t engine_id() const { return engine_id_; }
  // The engine's counters: every connection's, plus set-ups that failed (core/stats.h).
  const std::shared_ptr<Stats>& stats() const { return stats_; }
  uint64_t next_request_id() { return next_request_id_.fetch_add(1); }

 protected:
  // Runs a connect to `peer` through `attempt` (which counts refused, retried tries in
  // *retries): counts the retries, logs and counts ("errors.connect") a failure before
  // rethrowing it, and logs the new endpoint at DEBUG.
  std::shared_ptr<Connection> counted_connect(
      const std::string& peer,
      const std::function<std::shared_ptr<Connection>(int* retries)>& attempt);
  // Logs an accepted endpoint at DEBUG.
  void log_accepted(const Connection& conn) const;
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
  RegionTable regions_;

 private:
  const uint64_t engine_id_;
  const std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
  std::atomic<uint64_t> next_request_id_{1};
};

}  // namespace rdmaxfer
