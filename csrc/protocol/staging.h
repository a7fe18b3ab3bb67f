// The staging pipeline: device memory moved over any transport through host bounce slabs,
// with the device copies and the wire overlapped.
//
//   write:  D2H chunk i into slab k   while chunk i-1 (slab k-1) goes out as a WRITE
//   read:   READ chunk i into slab k  while chunk i-1 (slab k-1) goes up by H2D
//   send:   announced (RTS) when posted, so messages keep their post order, staged or not;
//           then in windows of at most a chunk (protocol/message_windows.h): the receiver
//           grants the message window by window (one window when it fits a chunk), each window
//           is copied D2H into a free slab and WRITTEN from there, window k+1's copy
//           overlapping window k's WRITE
//   recv:   a message of at most one chunk (or EAGER): RECV into one slab, then H2D; a longer
//           one: each free slab is granted the next window, a landed window goes up by H2D
//           while the next ones land in the other slabs
// Either way a message never needs more than `slots` slabs at each end, whatever its size.
//
// Chunks are `chunk` bytes (at most a slab; the last one shorter); `slots` slabs (1 = no
// overlap, 2 = double, 3 = triple buffering). The slabs come from the memory domain's bounce
// pool (transport/bounce_pool.h): made and registered once, reused by every operation, bounded
// in total; an operation waits for its slabs within its timeout. Copies go through a
// DeviceCopier (CUDA streams and events, or the host stand-in for tests); the wire through the
// ordinary Connection, so the transports are the real ones. Nothing here synchronizes the
// device: each slot waits on its own event.
//
// Lifecycle of a Stager: constructed on a transport (one per engine and device) -> post_*()
// each queue one operation for the Stager's workers (threads made on demand, at most
// kMaxWorkers, kept until close) and return its Request at once (terminal when the bytes are
// in place, failed with the first error: a copy failure, a wire failure, no slab in time, or
// the operation's timeout) -> close(): queued operations fail, those in flight stop within one
// wait slice (failing with a closed error), the workers are joined. If a wire operation cannot
// be stopped after a failure, its slab is stranded by the pool, so no late write can land in
// freed memory.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/descriptor.h"
#include "core/request.h"
#include "cuda/device_copier.h"
#include "protocol/connection.h"
#include "transport/bounce_pool.h"

namespace rdmaxfer {

struct StagingOptions {
  uint64_t chunk = 0;        // bytes per chunk (0: kDefaultChunk; clamped to the length and
                             // to the bounce pool's slab size)
  int slots = 0;             // bounce slabs (0: 3; clamped to the pool's bound)
  double timeout_s = 60.0;   // inactivity bound: no chunk done for that long
  TransferOptions wire;      // for the transport's own chunking/streams

  static constexpr uint64_t kDefaultChunk = 8ull << 20;
  static constexpr int kDefaultSlots = 3;
  static constexpr int kMaxSlots = 8;
};

// What a Stager's operations did so far (for tests, Engine reports and tuning).
struct StagerStats {
  uint64_t messages_direct = 0;    // messages moved by GPUDirect, between registrations
  uint64_t messages_whole = 0;     // messages staged whole through one slab
  uint64_t messages_windowed = 0;  // messages staged window by window (longer than a chunk)
  uint64_t overlapped_copies = 0;  // device copies started while the same operation had other
                                   // bytes on the wire
};

class Stager {
 public:
  Stager(Transport& transport, std::shared_ptr<DeviceCopier> copier);
  ~Stager();
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // One-sided: `length` bytes between device address `device` and the peer's region.
  RequestPtr post_write(const std::shared_ptr<Connection>& conn, uint64_t device, uint64_t length,
                        const Descriptor& remote, uint64_t remote_offset,
                        const StagingOptions& options);
  RequestPtr post_read(const std::shared_ptr<Connection>& conn, uint64_t device, uint64_t length,
                       const Descriptor& remote, uint64_t remote_offset,
                       const StagingOptions& options);
  // Two-sided: one message of `length` bytes with `meta`; the receive places the announced
  // message `msg_id` (from post_recv_header) into device memory.
  RequestPtr post_send(const std::shared_ptr<Connection>& conn, uint64_t device, uint64_t length,
                       const std::string& meta, const StagingOptions& options);
  RequestPtr post_recv(const std::shared_ptr<Connection>& conn, uint64_t msg_id, uint64_t device,
                       uint64_t length, const StagingOptions& options);

  // GPUDirect (both ends' device memory registered for the NIC, dmabuf or peermem): the message
  // moves by rendezvous WRITE between the registrations (`region` is the device memory), no
  // slab, no copy; never EAGER, as the CPU cannot read device memory. A received EAGER message
  // (a small one from host memory) is staged through a slab instead. Counted as
  // messages_direct (the staged ones as messages_whole / messages_windowed).
  RequestPtr post_send_direct(const std::shared_ptr<Connection>& conn,
                              const std::shared_ptr<MemoryRegion>& region, uint64_t offset,
                              uint64_t length, const std::string& meta,
                              const StagingOptions& options);
  RequestPtr post_recv_direct(const std::shared_ptr<Connection>& conn, uint64_t msg_id,
                              const std::shared_ptr<MemoryRegion>& region, uint64_t offset,
                              uint64_t length, const StagingOptions& options);

  void close();
  std::string describe() const { return copier_->describe(); }
  // Operations running, and worker threads made so far (never more than kMaxWorkers).
  int active() const;
  int workers() const;
  // The counters of the bounce pool this Stager's transfers take their slabs from.
  BouncePoolStats pool_stats() const { return transport_.domain().bounce_pool().stats(); }
  StagerStats stats() const;

  static constexpr int kMaxWorkers = 8;

 private:
  struct Op;
  class Pipeline;
  RequestPtr post_one_sided(bool write, const std::shared_ptr<Connection>& conn, uint64_t device,
                            uint64_t length, const Descriptor& remote, uint64_t remote_offset,
                            const StagingOptions& options);
  RequestPtr start(std::unique_ptr<Op> op);
  void work();
  // Runs the operation; returns what ends its request (complete or fail).
  std::function<void()> run(Op& op);

  Transport& transport_;
  std::shared_ptr<DeviceCopier> copier_;
  mutable std::mutex mu_;
  std::condition_variable queued_;
  bool closed_ = false;
  std::atomic<bool> closing_{false};  // operations in flight stop at their next wait slice
  std::deque<std::shared_ptr<Op>> queue_;
  std::vector<std::thread> workers_;
  int idle_ = 0;
  int active_ = 0;
  std::atomic<uint64_t> messages_direct_{0};
  std::atomic<uint64_t> messages_whole_{0};
  std::atomic<uint64_t> messages_windowed_{0};
  std::atomic<uint64_t> overlapped_copies_{0};
};

}  // namespace rdmaxfer
