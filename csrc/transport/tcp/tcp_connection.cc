#include "transport/tcp/tcp_connection.h"

#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "engine/chunking.h"

namespace rdmaxfer {

namespace {
constexpr uint64_t kMaxEagerAccepted = 1ull << 20;
constexpr size_t kMaxReason = 1024;

std::string bytes_text(uint64_t n) { return std::to_string(n) + " bytes"; }
}  // namespace

TcpConnection::TcpConnection(Transport& transport, const TcpConfig& config, std::string peer)
    : Connection(transport.stats()),
      transport_(transport),
      config_(config),
      peer_(std::move(peer)) {}

void TcpConnection::start(std::vector<UniqueFd> fds, const std::vector<IoLoop*>& loops) {
  for (size_t i = 0; i < fds.size(); ++i) {
    IoLoop* loop = loops[i % loops.size()];
    streams_.push_back(std::make_shared<TcpStream>(std::move(fds[i]), static_cast<int>(i), loop,
                                                   weak_from_this(), stats_));
  }
  for (auto& s : streams_) s->loop()->add(s);
}

void TcpConnection::check_open_locked() const {
  if (closed_) {
    throw Error(ErrorKind::kClosed, "endpoint to " + peer_ + " is closed (" + error_ +
                                        "); connect again to open a new endpoint");
  }
}

TcpStream& TcpConnection::least_loaded(int among) const {
  TcpStream* best = streams_[0].get();
  for (int i = 1; i < among; ++i) {
    if (streams_[static_cast<size_t>(i)]->queued_bytes() < best->queued_bytes()) {
      best = streams_[static_cast<size_t>(i)].get();
    }
  }
  return *best;
}

void TcpConnection::send_on(TcpStream& stream, OutFrame frame) {
  // A dead stream means the connection is being shut: the requests in its tables fail there,
  // and one that only this frame carries fails here.
  RequestPtr carried = frame.on_sent;
  if (!stream.enqueue(std::move(frame)) && carried) {
    std::string why = error();
    carried->fail(ErrorKind::kConnection,
                  "connection to " + peer_ + " is closed" + (why.empty() ? "" : ": " + why));
  }
}

void TcpConnection::send_ctrl(OutFrame frame) {
  const uint64_t bytes = frame.total();
  send_on(*streams_[0], std::move(frame));
  stats_->add_op("ctrl", bytes);
}

RequestPtr TcpConnection::new_request(OpKind op, uint64_t bytes, const char* kind) {
  auto req = std::make_shared<Request>(transport_.next_request_id(), op, bytes);
  req->set_stats(stats_, kind);
  return req;
}

RequestPtr TcpConnection::post_write(const std::shared_ptr<MemoryRegion>& local,
                                     uint64_t local_offset, const Descriptor& remote,
                                     uint64_t remote_offset, uint64_t length,
                                     const TransferOptions& options) {
  check_local_range(local, local_offset, length, "WRITE");
  check_remote_range(remote, remote_offset, length, "WRITE");
  auto req = new_request(OpKind::kWrite, length, "write");
  const ChunkPlan plan = plan_chunks(length, streams(), options);
  req->set_parts(plan.count);
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
    writes_[req->id()] = req;
  }
  const int first = least_loaded(plan.streams).index();
  for (uint64_t i = 0; i < plan.count; ++i) {
    const uint64_t off = i * plan.chunk;
    const uint64_t n = std::min(plan.chunk, length - std::min(length, off));
    FrameHeader h;
    h.type = FrameType::kWrite;
    h.req_id = req->id();
    h.addr = remote.addr + remote_offset + off;
    h.key = remote.key;
    h.aux = off;
    h.size = n;
    h.payload_len = n;
    h.total = length;
    OutFrame f = make_frame(h);
    f.data = local->addr() + local_offset + off;
    f.data_len = n;
    f.hold = RegionUse(local);
    f.progress = req;
    send_on(*streams_[static_cast<size_t>((first + static_cast<int>(i % plan.streams)) %
                                          plan.streams)],
            std::move(f));
  }
  return req;
}

RequestPtr TcpConnection::post_read(const std::shared_ptr<MemoryRegion>& local,
                                    uint64_t local_offset, const Descriptor& remote,
                                    uint64_t remote_offset, uint64_t length,
                                    const TransferOptions& options) {
  check_local_range(local, local_offset, length, "READ", LocalUse::kDestination);
  check_remote_range(remote, remote_offset, length, "READ");
  auto req = new_request(OpKind::kRead, length, "read");
  const ChunkPlan plan = plan_chunks(length, streams(), options);
  req->set_parts(plan.count);
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
    reads_[req->id()] = PendingRead{req, local, local->addr() + local_offset, length};
  }
  const int first = least_loaded(plan.streams).index();
  for (uint64_t i = 0; i < plan.count; ++i) {
    const uint64_t off = i * plan.chunk;
    const uint64_t n = std::min(plan.chunk, length - std::min(length, off));
    FrameHeader h;
    h.type = FrameType::kReadReq;
    h.req_id = req->id();
    h.addr = remote.addr + remote_offset + off;
    h.key = remote.key;
    h.aux = off;
    h.size = n;
    h.total = length;
    send_on(*streams_[static_cast<size_t>((first + static_cast<int>(i % plan.streams)) %
                                          plan.streams)],
            make_frame(h));
  }
  return req;
}

RequestPtr TcpConnection::post_send(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                                    uint64_t length, const std::string& meta,
                                    const TransferOptions& options) {
  check_local_range(local, offset, length, "SEND");
  if (meta.size() > FrameHeader::kMaxMeta) {
    throw Error(ErrorKind::kInvalidArgument, "SEND: metadata of " + bytes_text(meta.size()) +
                                                 " exceeds " + bytes_text(FrameHeader::kMaxMeta));
  }
  auto req = new_request(OpKind::kSend, length, "send");
  const bool eager = length <= config_.eager_limit;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
    sends_[req->id()] = PendingSend{req, local, local->addr() + offset, length, options};
  }
  FrameHeader h;
  h.type = eager ? FrameType::kMsgEager : FrameType::kMsgRts;
  h.req_id = req->id();
  h.size = length;
  h.payload_len = eager ? length : 0;
  OutFrame f = make_frame(h, meta);
  if (eager) {
    f.data = local->addr() + offset;
    f.data_len = length;
    f.hold = RegionUse(local);
  }
  send_ctrl(std::move(f));
  return req;
}

RequestPtr TcpConnection::post_recv_header() {
  auto req = new_request(OpKind::kRecvHeader, 0, "recv");
  std::unique_lock<std::mutex> lock(mu_);
  check_open_locked();
  std::optional<MessageInfo> info = inbox_.next_or_wait(req);
  lock.unlock();
  if (info) req->complete_with_message(std::move(*info));
  return req;
}

bool TcpConnection::cancel_recv_header(const RequestPtr& request) {
  std::lock_guard<std::mutex> lock(mu_);
  return inbox_.cancel(request);
}

RequestPtr TcpConnection::post_recv(uint64_t msg_id, const std::shared_ptr<MemoryRegion>& local,
                                    uint64_t offset, uint64_t length) {
  check_local_range(local, offset, length, "RECV", LocalUse::kDestination);
  auto req = new_request(OpKind::kRecv, length, "recv");
  std::unique_lock<std::mutex> lock(mu_);
  check_open_locked();
  auto& announced = inbox_.announced();
  auto it = announced.find(msg_id);
  if (it == announced.end()) {
    throw Error(ErrorKind::kInvalidArgument,
                "RECV: message " + std::to_string(msg_id) +
                    " was not announced by the peer or was already received");
  }
  if (it->second.length != length) {
    throw Error(ErrorKind::kInvalidArgument,
                "RECV: the message has " + bytes_text(it->second.length) +
                    " but the destination has " + bytes_text(length));
  }
  AnnouncedMessage ann = std::move(it->second);
  announced.erase(it);
  uint8_t* dst = local->addr() + offset;
  if (!ann.eager) recvs_[msg_id] = PendingRecv{req, local, dst, length, 0};
  lock.unlock();
  if (ann.eager && length > 0) std::memcpy(dst, ann.data.data(), length);
  FrameHeader h;
  h.type = FrameType::kMsgCts;
  h.req_id = msg_id;
  send_ctrl(make_frame(h));
  if (ann.eager) {
    stats_->add_lane(0, length);
    req->complete();
  }
  return req;
}

void TcpConnection::reject(uint64_t msg_id, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
    if (inbox_.announced().erase(msg_id) == 0) {
      throw Error(ErrorKind::kInvalidArgument,
                  "reject: message " + std::to_string(msg_id) + " is not waiting to be received");
    }
  }
  FrameHeader h;
  h.type = FrameType::kMsgReject;
  h.req_id = msg_id;
  send_ctrl(make_frame(h, reason.substr(0, kMaxReason)));
}

void TcpConnection::send_data_chunks(PendingSend send) {
  const ChunkPlan plan = plan_chunks(send.length, streams(), send.options);
  send.request->set_parts(plan.count);
  const int first = least_loaded(plan.streams).index();
  for (uint64_t i = 0; i < plan.count; ++i) {
    const uint64_t off = i * plan.chunk;
    const uint64_t n = std::min(plan.chunk, send.length - std::min(send.length, off));
    FrameHeader h;
    h.type = FrameType::kMsgData;
    h.req_id = send.request->id();
    h.aux = off;
    h.size = n;
    h.payload_len = n;
    OutFrame f = make_frame(h);
    f.data = send.base + off;
    f.data_len = n;
    f.hold = RegionUse(send.region);
    f.on_sent = send.request;
    f.progress = send.request;
    send_on(*streams_[static_cast<size_t>((first + static_cast<int>(i % plan.streams)) %
                                          plan.streams)],
            std::move(f));
  }
}

AccessStatus TcpConnection::acquire_request_range(const FrameHeader& h, uint32_t access,
                                                  RegionUse* use) const {
  // The chunk [addr, addr + len) must lie inside the request [addr - aux, addr - aux + total),
  // and the whole request inside one region: then no chunk of a bad request lands.
  const uint64_t len = h.type == FrameType::kWrite ? h.payload_len : h.size;
  if (h.aux > h.addr || h.aux > h.total || len > h.total - h.aux) {
    return AccessStatus::kOutOfBounds;
  }
  return transport_.regions().acquire(h.key, h.addr - h.aux, h.total, access, use);
}

void TcpConnection::choose_sink(TcpStream& /*stream*/, const FrameHeader& h,
                                const std::string& /*meta*/, RecvSink* sink) {
  auto protocol = [&](const std::string& what) {
    throw Error(ErrorKind::kProtocol,
                std::string(frame_type_name(h.type)) + " frame from " + peer_ + ": " + what);
  };
  switch (h.type) {
    case FrameType::kWrite: {
      RegionUse use;
      AccessStatus st = acquire_request_range(h, kAccessRemoteWrite, &use);
      sink->status = static_cast<uint32_t>(st);
      if (st == AccessStatus::kOk) {
        sink->dst = reinterpret_cast<uint8_t*>(h.addr);
        sink->hold = std::move(use);
      } else {
        sink->discard = true;
      }
      return;
    }
    case FrameType::kReadResp: {
      if (h.status != 0 && h.payload_len != 0) protocol("error response carries data");
      std::lock_guard<std::mutex> lock(mu_);
      auto it = reads_.find(h.req_id);
      if (it == reads_.end()) {
        sink->discard = true;  // the READ was aborted meanwhile
        return;
      }
      const PendingRead& r = it->second;
      if (h.aux > r.length || h.payload_len > r.length - h.aux) {
        protocol("response outside the requested range");
      }
      sink->dst = r.base + h.aux;
      sink->hold = RegionUse(r.region);
      sink->progress = r.request;
      return;
    }
    case FrameType::kMsgEager:
      if (h.payload_len != h.size) protocol("data length differs from message size");
      if (h.payload_len > kMaxEagerAccepted) protocol("eager message too large");
      sink->into_owned = true;
      return;
    case FrameType::kMsgData: {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = recvs_.find(h.req_id);
      if (it == recvs_.end()) protocol("data for a message that is not being received");
      const PendingRecv& r = it->second;
      if (h.aux > r.length || h.payload_len > r.length - h.aux) {
        protocol("data outside the message");
      }
      sink->dst = r.base + h.aux;
      sink->hold = RegionUse(r.region);
      sink->progress = r.request;
      return;
    }
    default:
      if (h.payload_len != 0) protocol("unexpected data");
      return;
  }
}

void TcpConnection::on_frame(TcpStream& stream, const FrameHeader& h, std::string meta,
                             RecvSink sink) {
  switch (h.type) {
    case FrameType::kWrite: {
      sink.hold = RegionUse();  // the bytes are in place; let deregistration proceed
      FrameHeader ack;
      ack.type = FrameType::kWriteAck;
      ack.req_id = h.req_id;
      ack.aux = h.aux;
      ack.size = h.payload_len;
      ack.status = sink.status;
      send_on(stream, make_frame(ack));
      return;
    }
    case FrameType::kWriteAck:
    case FrameType::kReadResp: {
      const bool is_write = h.type == FrameType::kWriteAck;
      RequestPtr req;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (is_write) {
          auto it = writes_.find(h.req_id);
          if (it == writes_.end()) return;
          req = it->second;
          if (h.status != 0) writes_.erase(it);
        } else {
          auto it = reads_.find(h.req_id);
          if (it == reads_.end()) return;
          req = it->second.request;
          if (h.status != 0) reads_.erase(it);
        }
      }
      if (h.status != 0) {
        req->fail(ErrorKind::kRemoteAccess,
                  "peer " + peer_ + " refused access to " + bytes_text(h.size) +
                      " at remote offset " + std::to_string(h.aux) + " of the transfer: " +
                      access_status_text(static_cast<AccessStatus>(h.status)) +
                      " (check the descriptor, remote_offset and length)");
        return;
      }
      stats_->add_lane(stream.index(), h.size);
      req->part_done();
      if (req->done()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (is_write) {
          writes_.erase(h.req_id);
        } else {
          reads_.erase(h.req_id);
        }
      }
      return;
    }
    case FrameType::kReadReq: {
      RegionUse use;
      AccessStatus st = acquire_request_range(h, kAccessRemoteRead, &use);
      FrameHeader resp;
      resp.type = FrameType::kReadResp;
      resp.req_id = h.req_id;
      resp.aux = h.aux;
      resp.size = h.size;
      resp.status = static_cast<uint32_t>(st);
      OutFrame f = make_frame(resp);
      if (st == AccessStatus::kOk) {
        resp.payload_len = h.size;
        resp.encode(f.header);
        f.data = reinterpret_cast<const uint8_t*>(h.addr);
        f.data_len = h.size;
        f.hold = std::move(use);
      }
      send_on(stream, std::move(f));
      return;
    }
    case FrameType::kMsgRts:
    case FrameType::kMsgEager: {
      RequestPtr waiter;
      MessageInfo info{h.req_id, h.size, std::move(meta)};
      AnnouncedMessage ann;
      ann.length = h.size;
      ann.eager = h.type == FrameType::kMsgEager;
      ann.data = std::move(sink.owned);
      {
        std::lock_guard<std::mutex> lock(mu_);
        waiter = inbox_.announce(peer_, info, std::move(ann));
      }
      if (!waiter) return;
      waiter->complete_with_message(std::move(info));
      return;
    }
    case FrameType::kMsgCts:
    case FrameType::kMsgReject: {
      PendingSend send;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sends_.find(h.req_id);
        if (it == sends_.end()) return;
        send = std::move(it->second);
        sends_.erase(it);
      }
      if (h.type == FrameType::kMsgReject) {
        send.request->fail(ErrorKind::kProtocol,
                           "the receiver " + peer_ + " rejected the message: " + meta);
      } else if (send.length <= config_.eager_limit) {
        stats_->add_lane(0, send.length);
        send.request->complete();
      } else {
        send_data_chunks(std::move(send));
      }
      return;
    }
    case FrameType::kMsgData: {
      RequestPtr done;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = recvs_.find(h.req_id);
        if (it == recvs_.end()) return;
        it->second.received += h.payload_len;
        if (it->second.received == it->second.length) {
          done = it->second.request;
          recvs_.erase(it);
        }
      }
      sink.hold = RegionUse();
      stats_->add_lane(stream.index(), h.payload_len);
      if (done) done->complete();
      return;
    }
    case FrameType::kGoodbye:
      shut(ErrorKind::kConnection, "peer " + peer_ + " closed the endpoint", false,
           log::Level::kInfo);
      return;
  }
}

void TcpConnection::close() {
  // GOODBYE goes out after the connection is marked closed, so that the peer's reaction to it
  // (its EOF) cannot overtake our own, local reason for failing what is pending.
  shut(ErrorKind::kClosed, "closed locally", true, log::Level::kDebug);
}

void TcpConnection::abort(ErrorKind kind, const std::string& reason) {
  shut(kind, reason, false, connection_end_level(kind));
}

void TcpConnection::shut(ErrorKind kind, const std::string& reason, bool goodbye,
                         log::Level level) {
  std::vector<RequestPtr> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    error_ = reason;
    for (auto& [id, r] : writes_) failed.push_back(r);
    for (auto& [id, r] : reads_) failed.push_back(r.request);
    for (auto& [id, r] : sends_) failed.push_back(r.request);
    for (auto& [id, r] : recvs_) failed.push_back(r.request);
    for (auto& r : inbox_.clear()) failed.push_back(r);
    writes_.clear();
    reads_.clear();
    sends_.clear();
    recvs_.clear();
  }
  if (goodbye) {
    FrameHeader h;
    h.type = FrameType::kGoodbye;
    send_ctrl(make_frame(h));
  }
  for (auto& s : streams_) {
    for (auto& r : s->kill()) failed.push_back(std::move(r));
  }
  if (level >= log::Level::kWarning) stats_->add_error("connection");
  if (log::enabled(level)) {
    log::write(level, "tcp endpoint to " + peer_ + " closed (" + error_kind_name(kind) +
                          "): " + reason + "; " + std::to_string(failed.size()) +
                          " pending operation(s) failed");
  }
  for (auto& r : failed) r->fail(kind, reason);
}

bool TcpConnection::is_closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

std::string TcpConnection::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

}  // namespace rdmaxfer
