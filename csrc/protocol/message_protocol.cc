#include "protocol/message_protocol.h"

#include <algorithm>
#include <cstring>

#include "common/bytes.h"
#include "common/error.h"
#include "common/log.h"

namespace rdmaxfer {

namespace {
constexpr size_t kMaxReason = 1024;
}  // namespace

std::shared_ptr<Channel> MessageProtocol::channel() const {
  std::shared_ptr<Channel> channel = channel_.lock();
  if (!channel) throw Error(ErrorKind::kClosed, "the endpoint was destroyed");
  return channel;
}

void MessageProtocol::check_open_locked(const Channel& channel) const {
  if (!closed_) return;
  channel.check_open();  // throws the transport's own closed error
  throw Error(ErrorKind::kClosed, "endpoint to " + channel.peer() + " is closed");
}

void MessageProtocol::finished(const Request& request) {
  // A header wait counts only when it fails (its message counts once received).
  if (request.op() == OpKind::kRecvHeader && request.state() == Request::State::kDone) return;
  if (auto ch = channel_.lock()) {
    count_terminal(*ch->stats(), request, request.op() == OpKind::kSend ? "send" : "recv");
  }
}

void MessageProtocol::credit_stall(uint64_t /*msg_id*/) {
  if (auto ch = channel_.lock()) ch->stats()->add_credit_stall();
}

void MessageProtocol::protocol_error(const std::string& what) {
  throw Error(ErrorKind::kProtocol, what);
}

void MessageProtocol::check_meta(const std::string& meta, const ChannelLimits& limits) const {
  if (meta.size() > limits.ctrl_room) {
    throw Error(ErrorKind::kInvalidArgument,
                "SEND: metadata of " + bytes_text(meta.size()) + " exceeds the " +
                    bytes_text(limits.ctrl_room) + " a control message can carry");
  }
}

RequestPtr MessageProtocol::post_send(const std::shared_ptr<MemoryRegion>& local,
                                      uint64_t offset, uint64_t length, const std::string& meta,
                                      const TransferOptions& options, bool eager) {
  check_local_range(local, offset, length, "SEND");
  std::shared_ptr<Channel> ch = channel();
  const ChannelLimits limits = ch->limits();
  check_meta(meta, limits);
  PendingSend s;
  s.request = ch->new_request(OpKind::kSend, length);
  s.region = local;
  s.offset = offset;
  s.length = length;
  s.options = options;
  s.eager = eager && length <= limits.eager_limit && meta.size() + length <= limits.ctrl_room;
  s.meta = meta;
  RequestPtr req = s.request;
  enqueue(*ch, std::move(s));
  return req;
}

void MessageProtocol::enqueue(const Channel& ch, PendingSend send) {
  const uint32_t window = ch.limits().credit_window;
  const uint64_t id = send.request->id();
  std::weak_ptr<MessageProtocol> weak = weak_from_this();
  send.request->set_on_terminal([weak, id](const Request& done) {
    if (auto self = weak.lock()) {
      self->finished(done);
      self->release_credit(id);
      self->forget_send(id);
      self->abort_if_granted(done);
    }
  });
  bool now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked(ch);
    now = window == 0 || (waiting_.empty() && credits_used_ < window);
    send.credited = now;
    sends_[id] = std::move(send);
    if (!now) {
      waiting_.push_back(id);  // announced when an earlier message's send ends
    } else if (window != 0) {
      ++credits_used_;
    }
  }
  if (now) {
    announce(id);
  } else {
    credit_stall(id);
  }
}

void MessageProtocol::announce(uint64_t msg_id) {
  CtrlMessage m;
  CtrlPayload payload;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sends_.find(msg_id);
    if (it == sends_.end()) return;  // failed meanwhile (teardown)
    PendingSend& s = it->second;
    m.type = s.eager ? CtrlType::kEager : CtrlType::kRts;
    m.msg_id = msg_id;
    m.size = s.length;
    m.addr = s.window;
    m.key = s.depth;
    m.meta = std::move(s.meta);
    if (s.eager) {
      payload.data = s.region->addr() + s.offset;
      payload.length = s.length;
      payload.hold = RegionUse(s.region);
    }
  }
  if (auto ch = channel_.lock()) ch->send_ctrl(m, std::move(payload));
}

void MessageProtocol::release_credit(uint64_t msg_id) {
  uint64_t next = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sends_.find(msg_id);
    if (it != sends_.end() && !it->second.credited) return;  // still waiting: holds none
    if (closed_ || credits_used_ == 0) return;  // closing, or no window
    if (waiting_.empty()) {
      --credits_used_;
      return;
    }
    next = waiting_.front();  // the credit passes to it
    waiting_.pop_front();
    auto nit = sends_.find(next);
    if (nit != sends_.end()) nit->second.credited = true;
  }
  announce(next);
}

RequestPtr MessageProtocol::post_recv_header() {
  std::shared_ptr<Channel> ch = channel();
  RequestPtr req = ch->new_request(OpKind::kRecvHeader, 0);
  std::unique_lock<std::mutex> lock(mu_);
  check_open_locked(*ch);
  std::optional<MessageInfo> info = inbox_.next_or_wait(req);
  lock.unlock();
  if (info) req->complete_with_message(std::move(*info));
  return req;
}

bool MessageProtocol::cancel_recv_header(const RequestPtr& request) {
  std::lock_guard<std::mutex> lock(mu_);
  return inbox_.cancel(request);
}

AnnouncedMessage& MessageProtocol::announced_locked(const Channel& channel, uint64_t msg_id,
                                                   uint64_t length) {
  check_open_locked(channel);
  auto it = inbox_.announced().find(msg_id);
  if (it == inbox_.announced().end()) {
    throw Error(ErrorKind::kInvalidArgument,
                "RECV: message " + std::to_string(msg_id) +
                    " was not announced by the peer or was already received");
  }
  if (it->second.length != length) {
    throw Error(ErrorKind::kInvalidArgument, "RECV: the message has " +
                                                 bytes_text(it->second.length) +
                                                 " but the destination has " + bytes_text(length));
  }
  return it->second;
}

RequestPtr MessageProtocol::post_recv(uint64_t msg_id, const std::shared_ptr<MemoryRegion>& local,
                                      uint64_t offset, uint64_t length) {
  check_local_range(local, offset, length, "RECV", LocalUse::kDestination);
  std::shared_ptr<Channel> ch = channel();
  RequestPtr req = ch->new_request(OpKind::kRecv, length);
  uint8_t* dst = local->addr() + offset;
  CtrlMessage cts;
  cts.type = CtrlType::kCts;
  cts.msg_id = msg_id;
  bool eager = false;
  std::string data;
  AnnouncedMessage taken;  // put back if the grant fails
  std::shared_ptr<RecvWindows> windows;
  uint32_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    AnnouncedMessage& ann = announced_locked(*ch, msg_id, length);
    eager = ann.eager;
    if (eager) {
      data = std::move(ann.data);
      inbox_.announced().erase(msg_id);
    } else if (ann.window != 0 && length > ann.window) {
      // The sender writes at most ann.window bytes at once: granted window by window.
      const uint32_t ahead = std::clamp<uint32_t>(ann.depth + 1, 2, kMaxWindowsAhead);
      windows = start_windows_locked(msg_id, req, length, ann.window);  // `ann` is gone now
      windows->destination = local;
      windows->destination_offset = offset;
      windows->ahead = ahead;
    } else {
      taken = std::move(ann);
      inbox_.announced().erase(msg_id);
      value = pick_value_locked(static_cast<uint32_t>(msg_id));
      recv_by_value_[value] = msg_id;  // reserved until the grant is made
    }
  }
  if (eager) {
    if (length > 0) std::memcpy(dst, data.data(), length);
    ch->send_ctrl(cts, CtrlPayload());
    ch->stats()->add_lane(0, length);  // the EAGER came inside a control message, on lane 0
    req->complete();
    finished(*req);
    return req;
  }
  if (windows) {
    refill(windows);
    return req;
  }
  if (length == 0) {  // an empty rendezvous (a staged send): nothing to grant or write
    {
      std::lock_guard<std::mutex> lock(mu_);
      recv_by_value_.erase(value);
    }
    ch->send_ctrl(cts, CtrlPayload());
    req->complete();
    finished(*req);
    return req;
  }
  // Rendezvous: the peer writes straight into the destination, granted for this message.
  Grant grant;
  try {
    grant = ch->grant(local, offset, length, value, req);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    recv_by_value_.erase(value);
    if (!closed_) inbox_.announced().emplace(msg_id, std::move(taken));
    throw;
  }
  try {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked(*ch);
    recvs_[msg_id] = PendingRecv{req, grant.id};
  } catch (...) {
    ch->release_grant(grant.id);
    throw;
  }
  cts.addr = grant.addr;
  cts.key = grant.key;
  cts.route = grant.route;
  cts.size = length;
  // The usual value is taken by a receive in flight: name ours (one window, the whole message).
  if (value != static_cast<uint32_t>(msg_id)) cts.meta = encode_window(0, value);
  ch->send_ctrl(cts, CtrlPayload());
  return req;
}

void MessageProtocol::reject(uint64_t msg_id, const std::string& reason) {
  std::shared_ptr<Channel> ch = channel();
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked(*ch);
    if (inbox_.announced().erase(msg_id) == 0) {
      throw Error(ErrorKind::kInvalidArgument,
                  "reject: message " + std::to_string(msg_id) + " is not waiting to be received");
    }
  }
  CtrlMessage m;
  m.type = CtrlType::kReject;
  m.msg_id = msg_id;
  m.meta = reason.substr(0, std::min<uint64_t>(kMaxReason, ch->limits().ctrl_room));
  ch->send_ctrl(m, CtrlPayload());
}

void MessageProtocol::refuse_oversize(const CtrlMessage& message) {
  std::shared_ptr<Channel> ch = channel_.lock();
  if (!ch) return;
  const std::string reason =
      "a message of " + std::to_string(message.size) + " bytes exceeds its max_message_bytes=" +
      std::to_string(max_message_bytes_) + " (nothing was allocated for it); send smaller "
      "messages, or raise the bound on the receiver (RDMAXFER_MAX_MESSAGE_BYTES or "
      "EngineOptions(max_message_bytes=...))";
  log::write(log::Level::kWarning, "refused a message from " + ch->peer() + ": " + reason);
  CtrlMessage m;
  m.type = CtrlType::kReject;
  m.msg_id = message.msg_id;
  m.meta = reason.substr(0, std::min<uint64_t>(kMaxReason, ch->limits().ctrl_room));
  ch->send_ctrl(m, CtrlPayload());
  // A receive waiting for the next message would otherwise wait for one that never comes.
  RequestPtr waiter;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) waiter = inbox_.take_waiter();
  }
  if (waiter) {
    waiter->fail(ErrorKind::kProtocol,
                 "the next message from " + ch->peer() + " (" + std::to_string(message.size) +
                     " bytes) exceeds this engine's max_message_bytes=" +
                     std::to_string(max_message_bytes_) +
                     " and was refused (nothing was allocated for it); raise the bound here "
                     "(RDMAXFER_MAX_MESSAGE_BYTES or EngineOptions(max_message_bytes=...)), or "
                     "send smaller messages");
  }
}

void MessageProtocol::on_ctrl(CtrlMessage message) {
  if (message.type == CtrlType::kCts || message.type == CtrlType::kReject) {
    on_answer(message);
    return;
  }
  if (message.type == CtrlType::kAbort) {
    on_abort(message.msg_id, message.meta);
    return;
  }
  if (message.type == CtrlType::kNotify) {
    NotifyPayload payload = NotifyPayload::of(message);
    std::shared_ptr<Channel> ch = channel_.lock();
    if (notifications_ && ch) notifications_->push(Notification{ch->peer(), std::move(payload)});
    return;
  }
  if (max_message_bytes_ != 0 && message.size > max_message_bytes_) {
    refuse_oversize(message);
    return;
  }
  RequestPtr waiter;
  MessageInfo info{message.msg_id, message.size, std::move(message.meta)};
  AnnouncedMessage ann;
  ann.length = message.size;
  ann.eager = message.type == CtrlType::kEager;
  ann.data = std::move(message.data);
  if (message.type == CtrlType::kRts) {
    ann.window = message.addr;
    ann.depth = message.key;
  }
  std::string peer;
  if (auto ch = channel_.lock()) peer = ch->peer();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    waiter = inbox_.announce(peer, info, std::move(ann));
  }
  if (waiter) waiter->complete_with_message(std::move(info));
}

void MessageProtocol::on_answer(const CtrlMessage& message) {
  if (message.type == CtrlType::kCts && !message.meta.empty()) {
    on_window(message);
    return;
  }
  PendingSend send;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sends_.find(message.msg_id);
    if (it == sends_.end()) return;
    if (message.type == CtrlType::kCts) granted_sends_.insert(message.msg_id);
    if (it->second.windows && message.type == CtrlType::kCts) {
      // Its bytes come window by window (staging): kept until terminal, granted whole now.
      send = it->second;
      it->second.granted = it->second.length;
    } else {
      send = std::move(it->second);
      sends_.erase(it);
    }
  }
  std::shared_ptr<Channel> ch = channel_.lock();
  if (message.type == CtrlType::kReject) {
    send.request->fail(ErrorKind::kProtocol, "the receiver " + (ch ? ch->peer() : "") +
                                                 " rejected the message: " + message.meta);
  } else if (send.eager) {
    if (ch) ch->stats()->add_lane(0, send.length);  // inside the EAGER, on lane 0
    send.request->complete();
  } else {
    if (message.size != send.length) {
      const std::string what = "CTS for message " + std::to_string(message.msg_id) + " names " +
                               bytes_text(message.size) + ", not " + bytes_text(send.length);
      send.request->fail(ErrorKind::kProtocol, what);
      protocol_error(what);
    }
    if (!ch) return;
    const auto value = static_cast<uint32_t>(message.msg_id);
    if (send.length == 0) {  // nothing to write
      send.request->complete();
    } else if (send.windows) {
      send.windows->granted(
          WindowGrant{0, send.length, message.addr, message.key, value, message.route});
    } else {
      ch->post_write_notify(send.request, send.region, send.offset, send.length, message.addr,
                            message.key, message.route, value, send.options);
    }
  }
}

void MessageProtocol::on_notify(uint32_t value) {
  if (window_landed(value)) return;
  PendingRecv done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = recv_by_value_.find(value);
    if (it == recv_by_value_.end()) {
      if (closed_ || std::find(aborted_values_.begin(), aborted_values_.end(), value) !=
                         aborted_values_.end()) {
        return;
      }
      protocol_error("a WRITE with notification value " + std::to_string(value) +
             " matches no message being received");
    }
    auto rit = recvs_.find(it->second);
    recv_by_value_.erase(it);
    if (rit == recvs_.end()) return;
    done = std::move(rit->second);
    recvs_.erase(rit);
  }
  if (auto ch = channel_.lock()) ch->release_grant(done.grant);
  done.request->complete();
  finished(*done.request);
}

void MessageProtocol::on_closed(const Error& why) {
  std::vector<RequestPtr> failed_sends;     // counted by their on_terminal
  std::vector<RequestPtr> failed_requests;  // receives and header waits: counted here
  std::vector<RequestPtr> failed_windows;   // windows of windowed receives: parts, not counted
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& [id, s] : sends_) failed_sends.push_back(s.request);
    for (auto& [id, r] : recvs_) failed_requests.push_back(r.request);
    for (auto& [id, w] : windowed_) {
      failed_requests.push_back(w->request);
      for (auto& [value, p] : w->pending) failed_windows.push_back(p.landed);
    }
    for (auto& r : inbox_.clear()) failed_requests.push_back(r);
    sends_.clear();
    waiting_.clear();
    recvs_.clear();
    recv_by_value_.clear();
    windowed_.clear();
    granted_sends_.clear();
  }
  for (auto& r : failed_windows) r->fail(why);
  // The channel releases the grants itself (verbs: once the flushes are drained).
  for (auto& r : failed_sends) r->fail(why);
  // Receives and header waits are counted before they fail: the failure wakes their waiter,
  // who may read the counters at once. (The teardown log already names the cause.)
  if (why.kind() != ErrorKind::kClosed && !failed_requests.empty()) {
    if (auto ch = channel_.lock()) {
      for (size_t i = 0; i < failed_requests.size(); ++i) ch->stats()->add_error("recv");
    }
  }
  for (auto& r : failed_requests) r->fail(why);
}

std::vector<std::pair<std::string, uint64_t>> MessageProtocol::attributes() const {
  std::shared_ptr<Channel> ch = channel_.lock();
  const uint32_t window = ch ? ch->limits().credit_window : 0;
  if (window == 0) return {};
  std::lock_guard<std::mutex> lock(mu_);
  return {{"credit_window", window},
          {"sends_waiting_for_credit", waiting_.size()},
          {"messages_waiting_for_recv", inbox_.announced().size()}};
}

void MessageProtocol::abort_if_granted(const Request& done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (granted_sends_.erase(done.id()) == 0 || closed_) return;
  }
  if (done.state() != Request::State::kFailed) return;
  std::shared_ptr<Channel> ch = channel_.lock();
  if (!ch || ch->is_closed()) return;
  CtrlMessage m;
  m.type = CtrlType::kAbort;
  m.msg_id = done.id();
  m.meta = done.error_message().substr(0, std::min<uint64_t>(kMaxReason, ch->limits().ctrl_room));
  try {
    ch->send_ctrl(m, CtrlPayload());
  } catch (const Error&) {
    // Closed meanwhile: the peer's teardown fails its RECV.
  }
}

void MessageProtocol::on_abort(uint64_t msg_id, const std::string& reason) {
  std::vector<uint64_t> grants;
  std::vector<RequestPtr> parts;  // windows in flight of a windowed receive
  RequestPtr recv;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    std::vector<uint32_t> values;
    if (auto it = recvs_.find(msg_id); it != recvs_.end()) {
      recv = it->second.request;
      grants.push_back(it->second.grant);
      recvs_.erase(it);
      for (const auto& [value, id] : recv_by_value_) {
        if (id == msg_id) values.push_back(value);
      }
    } else if (auto wit = windowed_.find(msg_id); wit != windowed_.end()) {
      recv = wit->second->request;
      for (auto& [value, p] : wit->second->pending) {
        values.push_back(value);
        grants.push_back(p.grant);
        parts.push_back(p.landed);
      }
      wit->second->pending.clear();
      windowed_.erase(wit);
    } else {
      return;  // landed already (its WRITE completed here, its ACK was lost), or unknown
    }
    for (uint32_t value : values) {
      recv_by_value_.erase(value);
      aborted_values_.push_back(value);
      if (aborted_values_.size() > kMaxAborted) aborted_values_.pop_front();
    }
  }
  std::shared_ptr<Channel> ch = channel_.lock();
  const Error why(ErrorKind::kConnection,
                  "the sender " + (ch ? ch->peer() : std::string("peer")) + " gave up on message " +
                      std::to_string(msg_id) + " after it was granted, and it was not delivered: " +
                      reason + " (the sender may send it again)");
  if (ch) {
    for (uint64_t g : grants) ch->release_grant(g);
    ch->stats()->add_error("recv");  // counted before the failure wakes its waiter
  }
  for (const RequestPtr& p : parts) p->fail(why);
  recv->fail(why);
}

}  // namespace rdmaxfer
