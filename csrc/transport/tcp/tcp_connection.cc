#include "transport/tcp/tcp_connection.h"

#include "common/bytes.h"
#include "common/error.h"
#include "common/log.h"
#include "core/transport_ids.h"
#include "transport/chunking.h"

namespace rdmaxfer {

namespace {
constexpr uint64_t kMaxEagerAccepted = 1ull << 20;
}  // namespace

void TcpConnection::check_cpu_addressable(const MemoryRegion& local, const char* what) {
  if (local.cpu_addressable()) return;
  throw Error(ErrorKind::kInvalidArgument,
              std::string(what) + ": the local region is GPU memory registered for CUDA IPC, "
                                  "which moves directly only on shm connections (peers on this "
                                  "host); over TCP pass the GPU array itself (it is staged "
                                  "through host memory)");
}

TcpConnection::TcpConnection(Transport& transport, const TcpConfig& config, std::string peer,
                             uint64_t peer_engine)
    : Channel(transport.stats()),
      transport_(transport),
      config_(config),
      peer_(std::move(peer)),
      peer_engine_(peer_engine) {}

void TcpConnection::check_remote(const Descriptor& remote, uint64_t remote_offset,
                                 uint64_t length, const char* what) const {
  if (remote.transport != kTcpWireId || remote.engine_id != peer_engine_) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + ": the descriptor was made by a " +
                    transport_id_name(remote.transport) + " engine (id " +
                    engine_id_text(remote.engine_id) +
                    "), but this endpoint connects to the tcp engine " +
                    engine_id_text(peer_engine_) + " at " + peer_ +
                    "; use a descriptor that engine made (its region.descriptor())");
  }
  check_remote_range(remote, remote_offset, length, what);
}

void TcpConnection::start(std::vector<UniqueFd> fds, std::vector<std::unique_ptr<TlsSession>> tls,
                          const std::vector<IoLoop*>& loops) {
  for (size_t i = 0; i < fds.size(); ++i) {
    IoLoop* loop = loops[i % loops.size()];
    streams_.push_back(std::make_shared<TcpStream>(
        std::move(fds[i]), i < tls.size() ? std::move(tls[i]) : nullptr, static_cast<int>(i),
        loop, weak_from_this(), stats_));
  }
  for (auto& s : streams_) s->loop()->add(s);
}

void TcpConnection::check_open_locked() const {
  state_.check_open(peer_);
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

RequestPtr TcpConnection::post_write(const std::shared_ptr<MemoryRegion>& local,
                                     uint64_t local_offset, const Descriptor& remote,
                                     uint64_t remote_offset, uint64_t length,
                                     const TransferOptions& options) {
  check_local_range(local, local_offset, length, "WRITE");
  check_cpu_addressable(*local, "WRITE");
  check_remote(remote, remote_offset, length, "WRITE");
  auto req = std::make_shared<Request>(transport_.next_request_id(), OpKind::kWrite, length);
  count_when_terminal(req, "write");
  const ChunkPlan plan = plan_chunks(length, streams(), options);
  req->set_parts(plan.count);
  const int first = least_loaded(plan.streams).index();
  // On one stream the waiting thread can drive it (TcpStream::drive): no hand-off to the loop.
  if (plan.streams == 1) req->set_progress(streams_[static_cast<size_t>(first)]);
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
    writes_[req->id()] = req;
  }
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
  check_cpu_addressable(*local, "READ");
  check_remote(remote, remote_offset, length, "READ");
  auto req = std::make_shared<Request>(transport_.next_request_id(), OpKind::kRead, length);
  count_when_terminal(req, "read");
  const ChunkPlan plan = plan_chunks(length, streams(), options);
  req->set_parts(plan.count);
  const int first = least_loaded(plan.streams).index();
  // On one stream the waiting thread can drive it (TcpStream::drive): no hand-off to the loop.
  if (plan.streams == 1) req->set_progress(streams_[static_cast<size_t>(first)]);
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
    reads_[req->id()] = PendingRead{req, local, local->addr() + local_offset, length};
  }
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

RequestPtr TcpConnection::new_request(OpKind op, uint64_t bytes) {
  return std::make_shared<Request>(transport_.next_request_id(), op, bytes);
}

ChannelLimits TcpConnection::limits() const {
  ChannelLimits l;
  l.eager_limit = config_.eager_limit;
  l.ctrl_room = FrameHeader::kMaxMeta;
  l.credit_window = 0;  // TCP's own flow control bounds what the peer holds
  return l;
}

void TcpConnection::check_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  check_open_locked();
}

void TcpConnection::send_ctrl(const CtrlMessage& m, CtrlPayload payload) {
  FrameHeader h;
  h.req_id = m.msg_id;
  h.size = m.size;
  h.type = frame_type_of(m.type);
  h.addr = m.addr;  // CTS: the grant; RTS: the sender's window (protocol/message_windows.h)
  h.key = m.key;
  h.payload_len = payload.length;
  OutFrame f = make_frame(h, m.meta);
  if (payload.length > 0) {
    f.data = payload.data;
    f.data_len = payload.length;
    f.hold = std::move(payload.hold);
  }
  stats_->add_op("ctrl", f.total());
  send_on(*streams_[0], std::move(f));
}

Grant TcpConnection::grant(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                           uint64_t length, uint32_t value, const RequestPtr& progress) {
  std::lock_guard<std::mutex> lock(mu_);
  check_open_locked();
  return grants_.add(local, offset, length, value, progress);
}

void TcpConnection::release_grant(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  grants_.release(id);
}

void TcpConnection::post_write_notify(const RequestPtr& request,
                                      const std::shared_ptr<MemoryRegion>& local,
                                      uint64_t offset, uint64_t length, uint64_t addr,
                                      uint32_t key, uint32_t /*route: any stream*/,
                                      uint32_t value, const TransferOptions& options) {
  const ChunkPlan plan = plan_chunks(length, streams(), options);
  request->set_parts(plan.count);
  const int first = least_loaded(plan.streams).index();
  for (uint64_t i = 0; i < plan.count; ++i) {
    const uint64_t off = i * plan.chunk;
    const uint64_t n = std::min(plan.chunk, length - std::min(length, off));
    FrameHeader h;
    h.type = FrameType::kMsgData;
    h.req_id = value;
    h.addr = addr + off;
    h.key = key;
    h.aux = off;
    h.size = n;
    h.payload_len = n;
    h.total = length;
    OutFrame f = make_frame(h);
    f.data = local->addr() + offset + off;
    f.data_len = n;
    f.hold = RegionUse(local);
    f.on_sent = request;
    f.progress = request;
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
  return transport_.domain().regions().acquire(h.key, h.addr - h.aux, h.total, access, use,
                                               /*by_cpu=*/true);
}

void TcpConnection::choose_sink(TcpStream& /*stream*/, const FrameHeader& h,
                                const std::string& meta, RecvSink* sink) {
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
    case FrameType::kWriteGather:
      choose_scatter(h, meta, sink);
      return;
    case FrameType::kReadGatherResp:
      choose_read_scatter(h, meta, sink);
      return;
    case FrameType::kMsgEager:
      if (h.payload_len != h.size) protocol("data length differs from message size");
      if (h.payload_len > kMaxEagerAccepted) protocol("eager message too large");
      sink->into_owned = true;
      return;
    case FrameType::kMsgData: {
      std::lock_guard<std::mutex> lock(mu_);
      const GrantEntry* found = grants_.find(h.key);
      if (found == nullptr) protocol("data for a message that is not being received");
      const GrantEntry& g = *found;
      if (h.aux > g.length || h.payload_len > g.length - h.aux || h.total != g.length ||
          h.addr != reinterpret_cast<uint64_t>(g.base) + h.aux) {
        protocol("data outside the message");
      }
      if (h.req_id != g.value) protocol("data with another message's notification");
      sink->dst = g.base + h.aux;
      sink->hold = RegionUse(g.region);
      sink->progress = g.progress;
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
      stats_->add_lane(stream.index(), h.size);  // a chunk of ours, placed
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
    case FrameType::kWriteGather: {
      sink.holds.clear();  // the bytes are in place
      FrameHeader ack;
      ack.type = FrameType::kWriteGatherAck;
      ack.req_id = h.req_id;
      ack.size = h.payload_len;
      const bool placed = sink.statuses.find_first_not_of('\0') == std::string::npos;
      ack.status = placed ? 0 : 1;
      send_on(stream, make_frame(ack, placed ? std::string() : std::move(sink.statuses)));
      return;
    }
    case FrameType::kWriteGatherAck:
      on_gather_ack(stream, h, meta);
      return;
    case FrameType::kReadGather:
      serve_read_gather(stream, h, meta);
      return;
    case FrameType::kReadGatherResp:
      sink.hold = RegionUse();  // the bytes are in place
      on_gather_ack(stream, h, meta);
      return;
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
    case FrameType::kMsgEager:
    case FrameType::kMsgCts:
    case FrameType::kMsgReject:
    case FrameType::kMsgNotify:
    case FrameType::kMsgAbort: {
      CtrlMessage m;
      m.type = ctrl_type_of(h.type);
      m.msg_id = h.req_id;
      m.size = h.size;
      m.addr = h.addr;
      m.key = h.key;
      m.meta = std::move(meta);
      m.data = std::move(sink.owned);
      events()->on_ctrl(std::move(m));
      return;
    }
    case FrameType::kMsgData: {
      bool landed = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        GrantEntry* g = grants_.find(h.key);
        if (g == nullptr) return;
        g->received += h.payload_len;
        stats_->add_lane(stream.index(), h.payload_len);
        landed = g->received == g->length;
      }
      sink.hold = RegionUse();
      if (landed) events()->on_notify(static_cast<uint32_t>(h.req_id));
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
    if (!state_.close(reason)) return;
    for (auto& [id, r] : writes_) failed.push_back(r);
    for (auto& [id, r] : reads_) failed.push_back(r.request);
    for (auto& [id, g] : gathers_) failed.push_back(g.request);
    writes_.clear();
    reads_.clear();
    gathers_.clear();
    grants_.clear();
  }
  if (goodbye) {
    FrameHeader h;
    h.type = FrameType::kGoodbye;
    OutFrame bye = make_frame(h);
    stats_->add_op("ctrl", bye.total());
    send_on(*streams_[0], std::move(bye));
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
  if (events()) events()->on_closed(Error(kind, reason));
}

bool TcpConnection::is_closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.closed();
}

std::string TcpConnection::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.reason();
}

}  // namespace rdmaxfer
