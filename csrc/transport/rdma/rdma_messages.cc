// RdmaConnection: the two-sided protocol (control_msg.h) — SEND/RECV, EAGER and rendezvous.
#include <arpa/inet.h>

#include <cstring>

#include "common/error.h"
#include "engine/chunking.h"
#include "transport/rdma/rdma_connection.h"

namespace rdmaxfer {

namespace {
constexpr size_t kMaxReason = 1024;
std::string bytes_text(uint64_t n) { return std::to_string(n) + " bytes"; }
}  // namespace

void RdmaConnection::send_ctrl(const CtrlHeader& header, const std::string& meta,
                               const uint8_t* data, size_t data_len) {
  SendWork w;
  w.opcode = IBV_WR_SEND;
  w.last = true;
  w.ctrl.resize(CtrlHeader::kSize + meta.size() + data_len);
  auto* p = reinterpret_cast<uint8_t*>(w.ctrl.data());
  header.encode(p);
  std::memcpy(p + CtrlHeader::kSize, meta.data(), meta.size());
  if (data_len > 0) std::memcpy(p + CtrlHeader::kSize + meta.size(), data, data_len);
  std::vector<SendWork> works;
  works.push_back(std::move(w));
  submit(0, std::move(works));
}

RequestPtr RdmaConnection::post_send(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                                     uint64_t length, const std::string& meta,
                                     const TransferOptions& options) {
  check_local_range(local, offset, length, "SEND");
  const uint64_t room = peer_ctrl_size_ > CtrlHeader::kSize ? peer_ctrl_size_ - CtrlHeader::kSize
                                                            : 0;
  if (meta.size() > room) {
    throw Error(ErrorKind::kInvalidArgument,
                "SEND: metadata of " + bytes_text(meta.size()) + " exceeds the " +
                    bytes_text(room) + " an rdma control message can carry");
  }
  auto req = new_request(OpKind::kSend, length, "send");
  const bool eager = length <= settings_.eager_limit && meta.size() + length <= room;
  bool now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
    sends_[req->id()] = PendingSend{req, local, offset, length, options, eager, meta};
    now = waiting_.empty() && credits_used_ < window_;
    if (now) {
      ++credits_used_;
    } else {
      waiting_.push_back(req->id());  // announced when an earlier message's send ends
    }
  }
  if (now) {
    announce(req->id());
  } else {
    stats_->add_credit_stall();  // waits for the peer to answer an earlier message
  }
  return req;
}

void RdmaConnection::announce(uint64_t msg_id) {
  CtrlHeader h;
  std::string meta;
  const uint8_t* data = nullptr;
  uint64_t data_len = 0;
  std::shared_ptr<MemoryRegion> region;  // alive until the payload is copied
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sends_.find(msg_id);
    if (it == sends_.end()) return;  // failed meanwhile (teardown)
    PendingSend& s = it->second;
    meta = std::move(s.meta);
    h.type = s.eager ? CtrlType::kEager : CtrlType::kRts;
    h.msg_id = msg_id;
    h.size = s.length;
    h.meta_len = static_cast<uint32_t>(meta.size());
    h.payload_len = s.eager ? static_cast<uint32_t>(s.length) : 0;
    if (s.eager) {
      region = s.region;
      data = region->addr() + s.offset;
      data_len = s.length;
    }
  }
  send_ctrl(h, meta, data, data_len);  // copies the EAGER payload into the control message
}

void RdmaConnection::release_credit() {
  uint64_t next = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kClosed) return;
    if (waiting_.empty()) {
      if (credits_used_ > 0) --credits_used_;
      return;
    }
    next = waiting_.front();  // the credit passes to it
    waiting_.pop_front();
  }
  announce(next);
}

RequestPtr RdmaConnection::post_recv_header() {
  auto req = new_request(OpKind::kRecvHeader, 0, "recv");
  std::unique_lock<std::mutex> lock(mu_);
  check_open_locked();
  std::optional<MessageInfo> info = inbox_.next_or_wait(req);
  lock.unlock();
  if (info) req->complete_with_message(std::move(*info));
  return req;
}

bool RdmaConnection::cancel_recv_header(const RequestPtr& request) {
  std::lock_guard<std::mutex> lock(mu_);
  return inbox_.cancel(request);
}

RequestPtr RdmaConnection::post_recv(uint64_t msg_id, const std::shared_ptr<MemoryRegion>& local,
                                     uint64_t offset, uint64_t length) {
  check_local_range(local, offset, length, "RECV", LocalUse::kDestination);
  auto req = new_request(OpKind::kRecv, length, "recv");
  auto validate = [&]() -> AnnouncedMessage& {
    check_open_locked();
    auto it = inbox_.announced().find(msg_id);
    if (it == inbox_.announced().end()) {
      throw Error(ErrorKind::kInvalidArgument,
                  "RECV: message " + std::to_string(msg_id) +
                      " was not announced by the peer or was already received");
    }
    if (it->second.length != length) {
      throw Error(ErrorKind::kInvalidArgument,
                  "RECV: the message has " + bytes_text(it->second.length) +
                      " but the destination has " + bytes_text(length));
    }
    return it->second;
  };
  bool eager = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    eager = validate().eager;
  }
  uint8_t* dst = local->addr() + offset;
  CtrlHeader cts;
  cts.type = CtrlType::kCts;
  cts.msg_id = msg_id;
  if (eager) {
    std::string data;
    {
      std::lock_guard<std::mutex> lock(mu_);
      data = std::move(validate().data);
      inbox_.announced().erase(msg_id);
    }
    if (length > 0) std::memcpy(dst, data.data(), length);
    send_ctrl(cts, "", nullptr, 0);
    stats_->add_lane(0, length);  // the EAGER came on QP 0 (send_ctrl)
    req->complete();
    return req;
  }
  // Rendezvous: the peer writes straight into dst, which needs REMOTE_WRITE.
  std::unique_ptr<VerbsMr> temp;
  uint32_t rkey = local->key();
  if ((local->access() & kAccessRemoteWrite) == 0) {
    temp = std::make_unique<VerbsMr>(shared_.pd, dst, length,
                                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    rkey = temp->rkey();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    validate();
    const uint32_t imm = static_cast<uint32_t>(msg_id);
    if (recv_by_imm_.count(imm) != 0) {
      throw Error(ErrorKind::kProtocol, "RECV: two messages in flight share immediate " +
                                            std::to_string(imm));
    }
    inbox_.announced().erase(msg_id);
    recv_by_imm_[imm] = msg_id;
    recvs_[msg_id] = PendingRecv{req, RegionUse(local), std::move(temp)};
  }
  cts.addr = reinterpret_cast<uint64_t>(dst);
  cts.rkey = rkey;
  cts.size = length;
  send_ctrl(cts, "", nullptr, 0);
  return req;
}

void RdmaConnection::reject(uint64_t msg_id, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
    if (inbox_.announced().erase(msg_id) == 0) {
      throw Error(ErrorKind::kInvalidArgument,
                  "reject: message " + std::to_string(msg_id) + " is not waiting to be received");
    }
  }
  CtrlHeader h;
  h.type = CtrlType::kReject;
  h.msg_id = msg_id;
  std::string text = reason.substr(0, std::min<size_t>(kMaxReason, peer_ctrl_size_ - CtrlHeader::kSize));
  h.meta_len = static_cast<uint32_t>(text.size());
  send_ctrl(h, text, nullptr, 0);
}

void RdmaConnection::on_recv(int lane, const ibv_wc& wc) {
  const uint32_t slot = static_cast<uint32_t>(wc.wr_id & 0xffffffffu);
  Lane& l = lanes_[static_cast<size_t>(lane)];
  if (slot >= l.recv_slab->count()) {
    throw Error(ErrorKind::kProtocol, "receive completion for unknown slot");
  }
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    const uint32_t imm = ntohl(wc.imm_data);
    post_recv_slot(lane, slot);
    PendingRecv done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = recv_by_imm_.find(imm);
      if (it == recv_by_imm_.end()) {
        if (state_ == State::kClosed) return;
        throw Error(ErrorKind::kProtocol,
                    "WRITE_WITH_IMM with immediate " + std::to_string(imm) +
                        " matches no message being received");
      }
      auto rit = recvs_.find(it->second);
      recv_by_imm_.erase(it);
      if (rit == recvs_.end()) return;
      done = std::move(rit->second);
      recvs_.erase(rit);
    }
    done.temp_mr.reset();
    done.hold = RegionUse();
    stats_->add_lane(lane, done.request->bytes());  // every chunk came on this QP
    done.request->complete();
    return;
  }
  if (wc.opcode != IBV_WC_RECV) {
    throw Error(ErrorKind::kProtocol, "unexpected receive opcode " + std::to_string(wc.opcode));
  }
  const uint8_t* p = l.recv_slab->slot(slot);
  const CtrlHeader h = CtrlHeader::decode(p, wc.byte_len);
  std::string meta(reinterpret_cast<const char*>(p + CtrlHeader::kSize), h.meta_len);
  std::string data(reinterpret_cast<const char*>(p + CtrlHeader::kSize + h.meta_len),
                   h.payload_len);
  post_recv_slot(lane, slot);
  on_ctrl(h, std::move(meta), std::move(data));
}

void RdmaConnection::on_ctrl(const CtrlHeader& h, std::string meta, std::string data) {
  switch (h.type) {
    case CtrlType::kRts:
    case CtrlType::kEager: {
      RequestPtr waiter;
      MessageInfo info{h.msg_id, h.size, std::move(meta)};
      AnnouncedMessage ann;
      ann.length = h.size;
      ann.eager = h.type == CtrlType::kEager;
      ann.data = std::move(data);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (state_ == State::kClosed) return;
        waiter = inbox_.announce(peer_, info, std::move(ann));
      }
      if (!waiter) return;
      waiter->complete_with_message(std::move(info));
      return;
    }
    case CtrlType::kCts:
    case CtrlType::kReject: {
      PendingSend send;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sends_.find(h.msg_id);
        if (it == sends_.end()) return;
        send = std::move(it->second);
        sends_.erase(it);
        if (h.type == CtrlType::kCts && !send.eager) active_[send.request->id()] = send.request;
      }
      if (h.type == CtrlType::kReject) {
        send.request->fail(ErrorKind::kProtocol,
                           "the receiver " + peer() + " rejected the message: " + meta);
        release_credit();
      } else if (send.eager) {
        stats_->add_lane(0, send.length);  // inside the EAGER control SEND on QP 0
        send.request->complete();
        release_credit();
      } else {
        if (h.size != send.length) {
          throw Error(ErrorKind::kProtocol, "CTS for message " + std::to_string(h.msg_id) +
                                                " names " + bytes_text(h.size) + ", not " +
                                                bytes_text(send.length));
        }
        start_rendezvous(std::move(send), h.addr, h.rkey);
      }
      return;
    }
  }
}

void RdmaConnection::start_rendezvous(PendingSend send, uint64_t addr, uint32_t rkey) {
  // The chunks go on one QP, the last as WRITE_WITH_IMM: RC delivers them in order, so the
  // immediate's arrival means every byte is in place.
  const ChunkPlan plan = plan_chunks(send.length, 1, send.options, max_chunk());
  send.request->set_parts(plan.count);
  const int lane = least_loaded(streams());
  std::vector<SendWork> works;
  works.reserve(plan.count);
  for (uint64_t i = 0; i < plan.count; ++i) {
    const uint64_t off = i * plan.chunk;
    const uint64_t n = std::min(plan.chunk, send.length - std::min(send.length, off));
    SendWork w;
    w.opcode = i + 1 == plan.count ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    w.imm = static_cast<uint32_t>(send.request->id());
    w.local_addr = reinterpret_cast<uint64_t>(send.region->addr() + send.offset + off);
    w.length = static_cast<uint32_t>(n);
    w.lkey = send.region->lkey();
    w.remote_addr = addr + off;
    w.rkey = rkey;
    w.request = send.request;
    w.hold = RegionUse(send.region);
    w.last = i + 1 == plan.count;
    works.push_back(std::move(w));
  }
  submit(lane, std::move(works));
}

}  // namespace rdmaxfer
