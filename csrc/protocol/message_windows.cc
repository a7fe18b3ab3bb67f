// The windowed rendezvous (message_windows.h): the window records, the sender's SendWindows,
// and the MessageProtocol members that grant, track and land windows.
#include "protocol/message_windows.h"

#include <algorithm>
#include <chrono>
#include <iterator>

#include "common/bytes.h"
#include "common/error.h"
#include "protocol/message_protocol.h"

namespace rdmaxfer {

namespace {

constexpr uint8_t kWindowTag[4] = {'W', 'I', 'N', '1'};
constexpr size_t kWindowRecord = 16;  // tag, value (u32), offset (u64), little-endian

}  // namespace

std::string encode_window(uint64_t offset, uint32_t value) {
  std::string meta(kWindowRecord, '\0');
  auto* p = reinterpret_cast<uint8_t*>(meta.data());
  std::copy(std::begin(kWindowTag), std::end(kWindowTag), p);
  store_le<uint32_t>(p + 4, value);
  store_le<uint64_t>(p + 8, offset);
  return meta;
}

void decode_window(const std::string& meta, uint64_t* offset, uint32_t* value) {
  const auto* p = reinterpret_cast<const uint8_t*>(meta.data());
  if (meta.size() != kWindowRecord || !std::equal(std::begin(kWindowTag), std::end(kWindowTag), p)) {
    throw Error(ErrorKind::kProtocol, "a CTS carries " + bytes_text(meta.size()) +
                                          " of metadata that is no window record");
  }
  *value = load_le<uint32_t>(p + 4);
  *offset = load_le<uint64_t>(p + 8);
}

void SendWindows::use_source(std::shared_ptr<MemoryRegion> region, uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  source_ = std::move(region);
  source_offset_ = offset;
}

void SendWindows::granted(const WindowGrant& window) {
  std::shared_ptr<MemoryRegion> source;
  uint64_t base = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    source = source_;
    base = source_offset_;
    if (!source) granted_.push_back(window);
  }
  if (source) {
    write(window, source, base + window.offset);
    return;
  }
  changed_.notify_all();
}

std::optional<WindowGrant> SendWindows::take() {
  std::lock_guard<std::mutex> lock(mu_);
  if (granted_.empty()) return std::nullopt;
  WindowGrant w = granted_.front();
  granted_.pop_front();
  return w;
}

void SendWindows::wait(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, std::chrono::duration<double>(seconds),
                    [this] { return !granted_.empty() || request_->done(); });
}

RequestPtr SendWindows::write(const WindowGrant& window,
                              const std::shared_ptr<MemoryRegion>& region, uint64_t offset) {
  std::shared_ptr<Channel> ch = channel_.lock();
  if (!ch) throw Error(ErrorKind::kClosed, "the endpoint was destroyed");
  RequestPtr part = ch->new_request(OpKind::kSend, window.length);
  std::weak_ptr<SendWindows> weak = weak_from_this();
  part->then([weak](const Request& done) {
    if (auto self = weak.lock()) self->written(done);
  });
  ch->post_write_notify(part, region, offset, window.length, window.addr, window.key,
                        window.route, window.value, options_);
  return part;
}

void SendWindows::written(const Request& part) {
  if (part.state() == Request::State::kFailed) {
    request_->fail(part.error_kind(), part.error_message());
  } else {
    bool all = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      written_ += part.bytes();
      all = written_ == length_;
    }
    request_->note_progress(part.bytes());
    if (all) request_->complete();
  }
  changed_.notify_all();
}

std::shared_ptr<SendWindows> MessageProtocol::post_send_windows(uint64_t length,
                                                                const std::string& meta,
                                                                uint64_t window, uint32_t depth,
                                                                const TransferOptions& options) {
  if (window == 0) throw Error(ErrorKind::kInvalidArgument, "SEND: windows of 0 bytes");
  std::shared_ptr<Channel> ch = channel();
  check_meta(meta, ch->limits());
  PendingSend s;
  s.request = ch->new_request(OpKind::kSend, length);
  s.length = length;
  s.options = options;
  s.meta = meta;
  s.window = window;
  s.depth = std::max<uint32_t>(1, depth);
  s.windows = std::make_shared<SendWindows>(s.request, length, options, ch);
  std::shared_ptr<SendWindows> windows = s.windows;
  enqueue(*ch, std::move(s));
  return windows;
}

bool MessageProtocol::new_window(PendingSend& s, uint64_t offset, uint64_t length) {
  if (length == 0 || offset < s.granted || offset > s.length || length > s.length - offset ||
      (s.window != 0 && length > s.window)) {
    return false;
  }
  auto next = s.granted_ahead.lower_bound(offset);
  if (next != s.granted_ahead.end() && next->first < offset + length) return false;
  if (next != s.granted_ahead.begin() && std::prev(next)->first + std::prev(next)->second > offset) {
    return false;
  }
  if (offset != s.granted) {
    if (s.granted_ahead.size() >= kMaxGrantsOutOfOrder) return false;
    s.granted_ahead.emplace(offset, length);
    return true;
  }
  s.granted += length;
  for (auto ahead = s.granted_ahead.begin();
       ahead != s.granted_ahead.end() && ahead->first == s.granted;
       ahead = s.granted_ahead.erase(ahead)) {
    s.granted += ahead->second;
  }
  return true;
}

void MessageProtocol::on_window(const CtrlMessage& message) {
  uint64_t offset = 0;
  uint32_t value = 0;
  decode_window(message.meta, &offset, &value);
  const WindowGrant w{offset, message.size, message.addr, message.key, value, message.route};
  std::shared_ptr<SendWindows> windows;
  RequestPtr refused;
  std::string what;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sends_.find(message.msg_id);
    if (it == sends_.end()) return;  // failed meanwhile
    PendingSend& s = it->second;
    if (s.eager || !new_window(s, offset, w.length)) {
      what = "CTS for message " + std::to_string(message.msg_id) + " of " +
             bytes_text(s.length) + " grants " + bytes_text(w.length) + " at offset " +
             std::to_string(offset) + ", not a window it has left to grant (granted up to " +
             std::to_string(s.granted) + ", " + std::to_string(s.granted_ahead.size()) +
             " window(s) beyond, at most " + bytes_text(s.window != 0 ? s.window : s.length) +
             " each)";
      refused = s.request;
    } else {
      if (!s.windows) {
        s.windows = std::make_shared<SendWindows>(s.request, s.length, s.options, channel_);
        s.windows->use_source(s.region, s.offset);
      }
      windows = s.windows;
      granted_sends_.insert(message.msg_id);
    }
  }
  if (refused) {
    refused->fail(ErrorKind::kProtocol, what);
    protocol_error(what);
  }
  windows->granted(w);
}

void MessageProtocol::forget_send(uint64_t msg_id) {
  std::lock_guard<std::mutex> lock(mu_);
  sends_.erase(msg_id);
}

std::optional<Announcement> MessageProtocol::announcement(uint64_t msg_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inbox_.announced().find(msg_id);
  if (it == inbox_.announced().end()) return std::nullopt;
  const AnnouncedMessage& a = it->second;
  return Announcement{a.length, a.eager, a.window, a.depth};
}

uint32_t MessageProtocol::pick_value_locked(uint32_t preferred) {
  uint32_t value = preferred;
  while (recv_by_value_.count(value) != 0) value = 0x80000000u | next_value_++;
  return value;
}

std::shared_ptr<RecvWindows> MessageProtocol::start_windows_locked(uint64_t msg_id,
                                                                   const RequestPtr& request,
                                                                   uint64_t length,
                                                                   uint64_t window) {
  inbox_.announced().erase(msg_id);
  auto recv = std::make_shared<RecvWindows>();
  recv->msg_id = msg_id;
  recv->request = request;
  recv->length = length;
  recv->window = window;
  windowed_[msg_id] = recv;
  return recv;
}

std::shared_ptr<RecvWindows> MessageProtocol::post_recv_windows(uint64_t msg_id,
                                                                uint64_t length,
                                                                uint64_t window) {
  std::shared_ptr<Channel> ch = channel();
  RequestPtr req = ch->new_request(OpKind::kRecv, length);
  std::lock_guard<std::mutex> lock(mu_);
  const AnnouncedMessage& a = announced_locked(*ch, msg_id, length);
  if (a.eager || window == 0 || (a.window != 0 && window > a.window)) {
    throw Error(ErrorKind::kInvalidArgument,
                "RECV: message " + std::to_string(msg_id) + " cannot be received in windows of " +
                    bytes_text(window) + (a.eager ? " (it came whole, EAGER)" : "") +
                    (a.window != 0 ? " (its sender writes at most " + bytes_text(a.window) + ")"
                                   : ""));
  }
  return start_windows_locked(msg_id, req, length, window);
}

bool MessageProtocol::grant_window(const std::shared_ptr<RecvWindows>& recv,
                                   const std::shared_ptr<MemoryRegion>& region, uint64_t offset,
                                   WindowGrant* window, RequestPtr* landed) {
  std::shared_ptr<Channel> ch = channel();
  WindowGrant w;
  RequestPtr part;
  std::shared_ptr<MemoryRegion> into = region;
  uint64_t at = offset;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked(*ch);
    if (recv->next >= recv->length) return false;
    w.offset = recv->next;
    w.length = std::min(recv->window, recv->length - recv->next);
    recv->next += w.length;
    if (!into) {  // into the receive's own destination
      into = recv->destination;
      at = recv->destination_offset + w.offset;
    }
    w.value = pick_value_locked(0x80000000u | next_value_++);
    recv_by_value_[w.value] = recv->msg_id;
  }
  part = ch->new_request(OpKind::kRecv, w.length);
  Grant grant;
  try {
    check_local_range(into, at, w.length, "RECV", LocalUse::kDestination);
    grant = ch->grant(into, at, w.length, w.value, part);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    recv_by_value_.erase(w.value);
    throw;
  }
  try {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked(*ch);
    recv->pending[w.value] = RecvWindows::Pending{grant.id, w.length, part};
  } catch (...) {
    ch->release_grant(grant.id);
    throw;
  }
  w.addr = grant.addr;
  w.key = grant.key;
  w.route = grant.route;
  CtrlMessage cts;
  cts.type = CtrlType::kCts;
  cts.msg_id = recv->msg_id;
  cts.size = w.length;
  cts.addr = grant.addr;
  cts.key = grant.key;
  cts.route = grant.route;
  cts.meta = encode_window(w.offset, w.value);
  ch->send_ctrl(cts, CtrlPayload());
  if (window != nullptr) *window = w;
  if (landed != nullptr) *landed = part;
  return true;
}

void MessageProtocol::refill(const std::shared_ptr<RecvWindows>& recv) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_ || recv->pending.size() >= recv->ahead || recv->next >= recv->length) return;
    }
    if (!grant_window(recv, nullptr, 0, nullptr, nullptr)) return;
  }
}

bool MessageProtocol::window_landed(uint32_t value) {
  std::shared_ptr<RecvWindows> recv;
  RecvWindows::Pending pending;
  bool all = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = recv_by_value_.find(value);
    if (it == recv_by_value_.end()) return false;
    auto wit = windowed_.find(it->second);
    if (wit == windowed_.end()) return false;
    recv = wit->second;
    auto pit = recv->pending.find(value);
    if (pit == recv->pending.end()) return false;
    pending = std::move(pit->second);
    recv->pending.erase(pit);
    recv_by_value_.erase(it);
    recv->landed += pending.length;
    all = recv->landed == recv->length;
    if (all) windowed_.erase(wit);
  }
  if (auto ch = channel_.lock()) ch->release_grant(pending.grant);
  pending.landed->complete();
  recv->request->note_progress(pending.length);
  if (all) {
    recv->request->complete();
    finished(*recv->request);
  } else if (recv->destination) {
    refill(recv);
  }
  return true;
}

}  // namespace rdmaxfer
