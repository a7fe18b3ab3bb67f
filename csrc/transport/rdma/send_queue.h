// The software side of one QP's send queue: queueing, selective signaling, retirement.
//
// Lifecycle: attached to a QP in RTS -> submit() appends work and posts what fits: never more
// than `depth` WRs outstanding, never more control SENDs than free control slots; the rest
// waits here (in software, not in the provider) -> retire() on each completion frees every WR
// up to the completed one (RC completes a QP's send queue in order, so one signaled WR stands
// for the unsignaled ones before it) and posts more -> take_all() on teardown hands back every
// request still queued or in flight; the WRs in flight (and the regions they hold) stay until
// their flush completions retire them (idle() then says so).
//
// Signaling: the last WR of a request and every control SEND are signaled; so is every
// `signal_every`-th WR, so a long transfer frees slots while it runs. WRITEs and SENDs of at
// most the QP's granted max_inline bytes go inline (IBV_SEND_INLINE: the payload is copied into
// the WR at post time, the device does not read the local buffer).
//
// wr_id = tag << 40 | qp_index << 32 | sequence (32 bits, wraps). Thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/request.h"
#include "transport/rdma/buffer_slab.h"
#include "transport/rdma/verbs_qp.h"

namespace rdmaxfer {

// One WR the connection wants posted.
struct SendWork {
  ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
  uint64_t local_addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t imm = 0;             // WRITE_WITH_IMM only (host order; sent big-endian)
  RequestPtr request;           // request whose part this WR is (null: control message)
  bool last = false;            // last WR of its request: always signaled
  uint32_t piece = 0;           // its index in a gathered group (0 otherwise)
  RegionUse hold;               // keeps the local region registered while in flight
  std::string ctrl;             // control SEND: the message, copied into a slot when posted
  // One-sided chunks that may move to another rail (failover): the remote region's rkey on
  // each of the peer's rails (Descriptor::key_on). Null: bound to this QP (WRITE_WITH_IMM).
  std::shared_ptr<const std::vector<uint32_t>> remote_keys;
};

// What retire() learned from one completion.
struct Retired {
  std::vector<RequestPtr> parts_done;  // one entry per finished part
  RequestPtr failed;                   // the request of the failed WR, if any
  std::string failed_op;               // "RDMA WRITE", "RDMA READ", "SEND", ...
  uint32_t failed_piece = 0;           // the failed WR's SendWork::piece
  uint64_t part_bytes = 0;             // payload of the finished parts' WRs
  // Size of the control SEND this completion retired (0: none). Control SENDs are always
  // signaled, so one completion retires at most one.
  uint64_t ctrl_bytes = 0;
};

class SendQueue {
 public:
  SendQueue(QueuePair& qp, uint64_t wr_prefix, BufferSlab& ctrl_slots, uint32_t signal_every);
  SendQueue(const SendQueue&) = delete;
  SendQueue& operator=(const SendQueue&) = delete;

  // Queues the works and posts what fits; returns those refused because the queue is dead (its
  // QP failed or was torn down). Throws Error(kTransport) when ibv_post_send fails (the
  // connection then aborts).
  std::vector<SendWork> submit(std::vector<SendWork> works);
  std::vector<SendWork> submit(SendWork work);
  // A completion of this queue (`wc.status` may be an error). Posts queued work after freeing.
  Retired retire(const ibv_wc& wc);
  // Teardown: every request that is queued or in flight (duplicates removed); the backlog is
  // dropped, the WRs in flight wait for their (flush) completions.
  std::vector<RequestPtr> take_all();
  // Failover of this queue's rail: the queue dies and hands back, as works to post elsewhere,
  // every one-sided chunk queued or in flight (a chunk that completed unsignaled is sent again:
  // WRITE and READ are idempotent) and every control SEND not completed (its bytes copied back
  // out of its slot: one the peer received but whose ACK was lost arrives twice, and the peer
  // drops the repeat by its number, control_msg.h). Its QP must
  // be in ERR first; the flushes that follow retire nothing.
  std::vector<SendWork> take_works();
  // A failed rail healing, its QP renewed (QueuePair::renew): the queue lives again,
  // empty, with every control slot free; completions of WRs posted before are stale().
  void revive();
  // Whether `wc` is of a WR posted before the last revive() (a flush that came late).
  bool stale(const ibv_wc& wc) const;
  // No WR in flight (all completed or flushed).
  bool idle() const;
  size_t in_flight() const;
  uint64_t queued_bytes() const;

 private:
  struct InFlight {
    uint32_t seq;
    ibv_wr_opcode opcode;
    RequestPtr request;
    bool counts_part;
    int slot;  // control slot, or -1
    uint32_t length;
    uint32_t piece;
    RegionUse hold;
    uint64_t local_addr;
    uint64_t remote_addr;
    std::shared_ptr<const std::vector<uint32_t>> remote_keys;
  };
  void pump_locked();

  QueuePair& qp_;
  const uint64_t wr_prefix_;
  BufferSlab& ctrl_;
  const uint32_t depth_;
  const uint32_t signal_every_;

  mutable std::mutex mu_;
  std::deque<SendWork> backlog_;
  std::deque<InFlight> in_flight_;
  std::vector<int> free_slots_;
  uint32_t next_seq_ = 0;
  uint32_t live_from_ = 0;  // the first sequence number since the last revive()
  uint32_t unsignaled_ = 0;
  uint64_t queued_bytes_ = 0;
  bool dead_ = false;
};

const char* send_opcode_name(ibv_wr_opcode op);

}  // namespace rdmaxfer
