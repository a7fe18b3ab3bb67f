// The staging pipeline: device memory moved over any transport through host bounce buffers,
// with the device copies and the wire overlapped.
//
//   write:  D2H chunk i into bounce slot k   while chunk i-1 (slot k-1) goes out as a WRITE
//   read:   READ chunk i into bounce slot k  while chunk i-1 (slot k-1) goes up by H2D
//   send:   D2H into one message-sized bounce buffer, then one SEND (a two-sided message must
//           come from one registered range, so the receiver sees an ordinary message)
//   recv:   RECV into a message-sized bounce buffer, then H2D
//
// Chunks are `chunk` bytes (the last one shorter); `slots` bounce buffers (1 = no overlap,
// 2 = double, 3 = triple buffering). Copies go through a DeviceCopier (CUDA streams and events,
// or the host stand-in for tests); the wire through the ordinary Connection, so the transports
// are the real ones. Nothing here synchronizes the device: each slot waits on its own event.
//
// Lifecycle of a Stager: constructed on a transport (one per engine and device) -> post_*()
// each start one operation on a worker thread and return its Request at once (terminal when
// the bytes are in place, failed with the first error: a copy failure, a wire failure, or the
// operation's timeout) -> close(): operations in flight stop within one wait slice (failing
// with a closed error), the workers are joined, then it deregisters and frees the pooled bounce buffers. Bounce buffers are pooled and
// registered once with the transport. If a wire operation cannot be stopped after a failure,
// its bounce buffer is never freed (stranded), so no late write can land in freed memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/descriptor.h"
#include "core/request.h"
#include "cuda/device_copier.h"
#include "protocol/connection.h"

namespace rdmaxfer {

struct StagingOptions {
  uint64_t chunk = 0;        // bytes per chunk (0: kDefaultChunk, clamped to the length)
  int slots = 0;             // bounce buffers (0: 3)
  double timeout_s = 60.0;   // inactivity bound: no chunk done for that long
  TransferOptions wire;      // for the transport's own chunking/streams

  static constexpr uint64_t kDefaultChunk = 8ull << 20;
  static constexpr int kDefaultSlots = 3;
  static constexpr int kMaxSlots = 8;
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

  void close(double timeout_s);
  std::string describe() const { return copier_->describe(); }
  // Bounce buffers currently pooled (free) and their total bytes; for tests and `info`.
  size_t pooled_buffers() const;
  uint64_t pooled_bytes() const;
  int active() const;

 private:
  struct Bounce;
  struct Op;
  class Pipeline;
  RequestPtr post_one_sided(bool write, const std::shared_ptr<Connection>& conn, uint64_t device,
                            uint64_t length, const Descriptor& remote, uint64_t remote_offset,
                            const StagingOptions& options);
  RequestPtr start(std::unique_ptr<Op> op);
  void run(Op& op);
  std::unique_ptr<Bounce> acquire(uint64_t length);
  void release(std::unique_ptr<Bounce> bounce, bool in_use);
  void reap_locked();

  Transport& transport_;
  std::shared_ptr<DeviceCopier> copier_;
  mutable std::mutex mu_;
  bool closed_ = false;
  std::atomic<bool> closing_{false};  // operations in flight stop at their next wait slice
  std::vector<std::unique_ptr<Bounce>> pool_;
  std::vector<std::unique_ptr<Bounce>> stranded_;
  struct Worker {
    std::thread thread;
    bool finished = false;
  };
  std::list<Worker> workers_;
};

}  // namespace rdmaxfer
