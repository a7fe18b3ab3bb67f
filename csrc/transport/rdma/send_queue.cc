#include "transport/rdma/send_queue.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "common/error.h"

namespace rdmaxfer {

namespace {
constexpr int kMaxChain = 32;  // WRs handed to one ibv_post_send call
}

const char* send_opcode_name(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE: return "RDMA WRITE";
    case IBV_WR_RDMA_WRITE_WITH_IMM: return "RDMA WRITE_WITH_IMM";
    case IBV_WR_RDMA_READ: return "RDMA READ";
    case IBV_WR_SEND: return "SEND";
    default: return "send-queue operation";
  }
}

SendQueue::SendQueue(QueuePair& qp, uint64_t wr_prefix, BufferSlab& ctrl_slots,
                     uint32_t signal_every)
    : qp_(qp),
      wr_prefix_(wr_prefix),
      ctrl_(ctrl_slots),
      depth_(qp.limits().sq_depth),
      signal_every_(std::max<uint32_t>(1, signal_every)) {
  for (uint32_t i = ctrl_.count(); i > 0; --i) free_slots_.push_back(static_cast<int>(i - 1));
}

std::vector<SendWork> SendQueue::submit(SendWork work) {
  std::vector<SendWork> works;
  works.push_back(std::move(work));
  return submit(std::move(works));
}

std::vector<SendWork> SendQueue::submit(std::vector<SendWork> works) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dead_) return works;  // torn down (its abort fails the requests) or failed over
  for (auto& w : works) {
    queued_bytes_ += w.length;
    backlog_.push_back(std::move(w));
  }
  pump_locked();
  return {};
}

void SendQueue::pump_locked() {
  while (!backlog_.empty() && in_flight_.size() < depth_) {
    ibv_send_wr wrs[kMaxChain];
    ibv_sge sges[kMaxChain];
    int n = 0;
    while (n < kMaxChain && !backlog_.empty() && in_flight_.size() < depth_) {
      SendWork& w = backlog_.front();
      const bool is_ctrl = w.opcode == IBV_WR_SEND;
      int slot = -1;
      if (is_ctrl) {
        if (free_slots_.empty()) break;  // wait for a control SEND to complete
        slot = free_slots_.back();
        free_slots_.pop_back();
        std::memcpy(ctrl_.slot(static_cast<uint32_t>(slot)), w.ctrl.data(), w.ctrl.size());
        w.local_addr = reinterpret_cast<uint64_t>(ctrl_.slot(static_cast<uint32_t>(slot)));
        w.length = static_cast<uint32_t>(w.ctrl.size());
        w.lkey = ctrl_.lkey();
      }
      const uint32_t seq = next_seq_++;
      ibv_send_wr& wr = wrs[n];
      std::memset(&wr, 0, sizeof(wr));
      wr.wr_id = wr_prefix_ | seq;
      wr.opcode = w.opcode;
      if (w.length > 0) {
        sges[n].addr = w.local_addr;
        sges[n].length = w.length;
        sges[n].lkey = w.lkey;
        wr.sg_list = &sges[n];
        wr.num_sge = 1;
      }
      if (w.opcode != IBV_WR_SEND) {
        wr.wr.rdma.remote_addr = w.remote_addr;
        wr.wr.rdma.rkey = w.rkey;
      }
      if (w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) wr.imm_data = htonl(w.imm);
      const bool signal = w.last || is_ctrl || ++unsignaled_ >= signal_every_ ||
                          in_flight_.size() + 1 == depth_;
      if (signal) {
        wr.send_flags = IBV_SEND_SIGNALED;
        unsignaled_ = 0;
      }
      if (w.length > 0 && w.length <= qp_.limits().max_inline && w.opcode != IBV_WR_RDMA_READ) {
        wr.send_flags |= IBV_SEND_INLINE;
      }
      if (n > 0) wrs[n - 1].next = &wr;
      const bool counts_part = w.request != nullptr;
      in_flight_.push_back(InFlight{seq, w.opcode, std::move(w.request), counts_part, slot,
                                    w.length, w.piece, std::move(w.hold), w.local_addr,
                                    w.remote_addr, std::move(w.remote_keys)});
      backlog_.pop_front();
      ++n;
    }
    if (n == 0) return;
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(qp_.get(), &wrs[0], &bad);
    if (rc != 0) {
      dead_ = true;
      throw_errno(ErrorKind::kTransport,
                  std::string("ibv_post_send(") + send_opcode_name(wrs[0].opcode) + ")", rc);
    }
  }
}

Retired SendQueue::retire(const ibv_wc& wc) {
  Retired out;
  const uint32_t seq = static_cast<uint32_t>(wc.wr_id & 0xffffffffu);
  std::lock_guard<std::mutex> lock(mu_);
  if (wc.status != IBV_WC_SUCCESS) {
    dead_ = true;
    for (auto& f : in_flight_) {
      if (f.seq == seq) {
        out.failed = f.request;
        out.failed_op = send_opcode_name(f.opcode);
        out.failed_piece = f.piece;
        break;
      }
    }
    if (out.failed_op.empty()) out.failed_op = "send-queue operation";
    // The failed or flushed WR and those before it are off the QP: release them.
    while (!in_flight_.empty() && static_cast<int32_t>(seq - in_flight_.front().seq) >= 0) {
      in_flight_.pop_front();
    }
    return out;
  }
  // Everything up to `seq` has completed (in order on an RC send queue).
  while (!in_flight_.empty() && static_cast<int32_t>(seq - in_flight_.front().seq) >= 0) {
    InFlight& f = in_flight_.front();
    if (f.slot >= 0) {
      free_slots_.push_back(f.slot);
      out.ctrl_bytes = f.length;
    }
    queued_bytes_ -= std::min<uint64_t>(queued_bytes_, f.length);
    if (f.counts_part) {
      out.part_bytes += f.length;
      out.parts_done.push_back(std::move(f.request));
    }
    in_flight_.pop_front();
  }
  if (!dead_) pump_locked();
  return out;
}

std::vector<RequestPtr> SendQueue::take_all() {
  std::vector<RequestPtr> out;
  std::unordered_set<Request*> seen;
  std::lock_guard<std::mutex> lock(mu_);
  dead_ = true;
  for (auto& f : in_flight_) {
    if (f.request && seen.insert(f.request.get()).second) out.push_back(f.request);
  }
  for (auto& w : backlog_) {
    if (w.request && seen.insert(w.request.get()).second) out.push_back(w.request);
  }
  backlog_.clear();  // never posted: nothing of it is on the device
  queued_bytes_ = 0;
  return out;
}

std::vector<SendWork> SendQueue::take_works() {
  std::vector<SendWork> out;
  std::lock_guard<std::mutex> lock(mu_);
  dead_ = true;
  for (auto& f : in_flight_) {
    SendWork w;
    if (f.slot >= 0) {  // a control SEND: its message is in its slot
      w.opcode = IBV_WR_SEND;
      w.last = true;
      w.ctrl.assign(reinterpret_cast<const char*>(ctrl_.slot(static_cast<uint32_t>(f.slot))),
                    f.length);
      out.push_back(std::move(w));
      continue;
    }
    if (!f.counts_part) continue;
    w.opcode = f.opcode;
    w.local_addr = f.local_addr;
    w.length = f.length;
    w.piece = f.piece;
    w.remote_addr = f.remote_addr;
    w.request = std::move(f.request);
    w.hold = std::move(f.hold);
    w.remote_keys = std::move(f.remote_keys);
    out.push_back(std::move(w));
  }
  in_flight_.clear();
  for (auto& w : backlog_) out.push_back(std::move(w));
  backlog_.clear();
  queued_bytes_ = 0;
  return out;
}

void SendQueue::revive() {
  std::lock_guard<std::mutex> lock(mu_);
  backlog_.clear();
  in_flight_.clear();
  free_slots_.clear();
  for (uint32_t i = ctrl_.count(); i > 0; --i) free_slots_.push_back(static_cast<int>(i - 1));
  unsignaled_ = 0;
  queued_bytes_ = 0;
  live_from_ = next_seq_;
  dead_ = false;
}

bool SendQueue::stale(const ibv_wc& wc) const {
  const uint32_t seq = static_cast<uint32_t>(wc.wr_id & 0xffffffffu);
  std::lock_guard<std::mutex> lock(mu_);
  // Sequence numbers wrap: a WR is of the live QP when it is at most as old as live_from_
  // (counted back from next_seq_). A live WR older than kLiveSpan cannot still be in flight
  // (the send queue holds far fewer), so the span is capped there and keeps working past 2^32.
  constexpr uint32_t kLiveSpan = 1u << 30;
  const uint32_t live = std::min(next_seq_ - live_from_, kLiveSpan);
  return next_seq_ - seq > live;
}

bool SendQueue::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_.empty();
}

size_t SendQueue::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_.size();
}

uint64_t SendQueue::queued_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_bytes_;
}

}  // namespace rdmaxfer
