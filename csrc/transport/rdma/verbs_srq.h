// A shared receive queue (SRQ) of one rail, with its bounded pool of registered receive buffers:
// every RC QP of the rail takes its two-sided receives (control SENDs, WRITE_WITH_IMM) from it,
// so receive memory grows with the traffic, not with the number of peers.
//
// Lifecycle:
//   created    ibv_create_srq on the rail's PD (max_wr = the cap, clamped to the device's
//              max_srq_wr), a first chunk of buffers registered (BufferSlab) and posted, the
//              limit armed (ibv_modify_srq srq_limit = the low water, a quarter of the buffers).
//   in use     a receive completion (consumed or flushed) takes its buffer off the posted
//              count (taken()); once its bytes are copied out, repost() gives it back.
//              When the device runs low it raises IBV_EVENT_SRQ_LIMIT_REACHED (on_limit()), and
//              taken() checks the same low water: either adds one chunk of buffers, up to the
//              cap, and re-arms the limit. Buffers are never taken back: the pool holds what
//              the busiest moment needed, at most the cap.
//   destroyed  after every QP attached to it (each QP holds it by shared_ptr):
//              ibv_destroy_srq, then the buffers' MRs and memory, then the PD reference.
//
// A receive's wr_id is kWrIdFlag | buffer index (no connection tag: the completion's qp_num
// names the connection). Thread-safe: the rail's completion thread and callers that drive
// progress post and count under one mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/rdma/buffer_slab.h"
#include "transport/rdma/verbs_pd.h"

namespace rdmaxfer {

class SharedReceiveQueue {
 public:
  // Bit 32 set, tag bits (40..63) zero: no connection's wr_id looks like this (tags are never 0).
  static constexpr uint64_t kWrIdFlag = 1ull << 32;
  static bool owns(uint64_t wr_id) { return (wr_id >> 40) == 0 && (wr_id & kWrIdFlag) != 0; }

  // `buffer_size` bytes per buffer; `chunk` buffers at first and per growth step; at most
  // `cap` buffers (both clamped to the device's max_srq_wr). Throws Error(kTransport) with
  // errno text when ibv_create_srq, the registration or ibv_post_srq_recv fails.
  SharedReceiveQueue(std::shared_ptr<ProtectionDomain> pd, uint32_t buffer_size, uint32_t chunk,
                     uint32_t cap);
  ~SharedReceiveQueue();
  SharedReceiveQueue(const SharedReceiveQueue&) = delete;
  SharedReceiveQueue& operator=(const SharedReceiveQueue&) = delete;

  ibv_srq* get() const { return srq_; }

  // The buffer a receive completion's wr_id names; throws Error(kProtocol) for an unknown one.
  const uint8_t* buffer(uint64_t wr_id) const;
  // A receive WR of this SRQ completed (consumed or flushed): one fewer posted; grows the pool
  // when the posted buffers fell below the low water.
  void taken();
  // Posts the buffer of `wr_id` again. Throws Error(kTransport) when ibv_post_srq_recv fails
  // (the SRQ is in error: the rail's device failed).
  void repost(uint64_t wr_id);
  // IBV_EVENT_SRQ_LIMIT_REACHED: the device's posted WQEs fell below the limit; adds a chunk
  // (below the cap) and re-arms.
  void on_limit();

  uint32_t posted() const;   // receive WRs on the SRQ, by this side's count
  uint32_t buffers() const;  // buffers allocated (posted or being handled)
  uint32_t cap() const { return cap_; }
  uint32_t buffer_size() const { return buffer_size_; }
  uint64_t grows() const;    // chunks added after the first
  // False when the provider refused srq_limit (growth then rests on the low-water check).
  bool limit_armed() const;

 private:
  void grow_locked();  // one chunk more (below the cap), posted, limit re-armed
  void post_locked(uint32_t index);
  void arm_locked();

  std::shared_ptr<ProtectionDomain> pd_;
  const uint32_t buffer_size_;
  uint32_t chunk_;
  uint32_t cap_;
  ibv_srq* srq_ = nullptr;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<BufferSlab>> slabs_;  // chunk_ buffers each; index / chunk_
  uint32_t posted_ = 0;
  uint64_t grows_ = 0;
  bool limit_ok_ = true;
};

}  // namespace rdmaxfer
