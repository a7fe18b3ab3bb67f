#include "transport/ofi/ofi_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/test_hooks.h"
#include "transport/chunking.h"
#include "transport/ofi/ofi_transport.h"
#include "transport/socket.h"

namespace rdmaxfer {

namespace {

constexpr double kSendTimeoutS = 30.0;

// The largest RMA every rail's endpoint takes.
uint64_t smallest_max_msg(const std::vector<OfiPeerRail>& rails) {
  uint64_t n = UINT64_MAX;
  for (const OfiPeerRail& r : rails) n = std::min(n, r.domain->settings().max_msg_size);
  return n;
}


}  // namespace

OfiChannel::OfiChannel(OfiTransport& transport, std::vector<OfiPeerRail> rails, UniqueFd fd,
                       std::unique_ptr<TlsSession> tls, uint64_t peer_max_msg, std::string peer,
                       bool connector)
    : Channel(transport.stats()),
      transport_(transport),
      rails_(std::move(rails)),
      domain_(rails_.at(0).domain),
      fd_(std::make_shared<UniqueFd>(std::move(fd))),
      tls_(std::move(tls)),
      max_chunk_(std::min(smallest_max_msg(rails_), peer_max_msg)),
      notify_chunk_(std::min(kNotifyChunk, max_chunk_)),
      peer_(std::move(peer)),
      connector_(connector),
      heal_first_s_(test_hooks::ofi_rejoin_first_s()),
      rail_up_(rails_.size(), 1),
      rail_cause_(rails_.size()),
      rail_bytes_(std::make_unique<std::atomic<uint64_t>[]>(rails_.size())),
      meter_(rails_.size()),
      heal_(rails_.size()),
      done_parts_(rails_.size()) {
  set_nonblocking(fd_->get(), true);
  const auto [domain, bytes] = test_hooks::ofi_rail_error();
  const auto [lost_domain, lost_bytes] = test_hooks::ofi_lost_read();
  for (size_t i = 0; i < rails_.size(); ++i) {
    const std::string& name = rails_[i].domain->settings().domain;
    if (!domain.empty() && name == domain) {
      test_err_rail_ = i;
      test_err_bytes_ = bytes;
    }
    if (!lost_domain.empty() && name == lost_domain) {
      test_lost_rail_ = i;
      test_lost_bytes_ = lost_bytes;
    }
  }
}

OfiChannel::~OfiChannel() {
  shut(ErrorKind::kClosed, "endpoint dropped", true);
  if (reader_.joinable()) {
    if (reader_.get_id() == std::this_thread::get_id()) {
      reader_.detach();  // the last holder let go in an upcall: the thread ends by itself
    } else {
      reader_.join();
    }
  }
}

void OfiChannel::start() {
  reader_ = std::thread(read_loop, weak_from_this(), fd_, tls_, peer_);
}

std::string OfiChannel::peer_text(const std::string& meta) {
  std::string out = meta.substr(0, 1024);
  for (char& c : out) c = c < 0x20 || c > 0x7e ? '?' : c;
  return out;
}

void OfiChannel::read_loop(std::weak_ptr<OfiChannel> weak, std::shared_ptr<UniqueFd> fd,
                           std::shared_ptr<TlsSession> tls, std::string peer) {
  std::string why;
  for (;;) {
    uint8_t raw[OfiFrameHeader::kSize];
    if (!read_stream(fd->get(), tls.get(), raw, sizeof(raw), &why)) break;
    OfiFrameHeader h;
    std::string meta;
    std::string data;
    try {
      h = OfiFrameHeader::unpack(raw);
      meta.resize(h.meta_len);
      data.resize(h.data_len);
      if (!read_stream(fd->get(), tls.get(), meta.data(), meta.size(), &why) ||
          !read_stream(fd->get(), tls.get(), data.data(), data.size(), &why)) {
        break;
      }
    } catch (const Error& e) {
      if (auto self = weak.lock()) self->shut(ErrorKind::kProtocol, e.what(), true);
      return;
    }
    auto self = weak.lock();
    if (!self) return;
    if (h.kind == OfiFrameKind::kGoodbye) {
      self->shut(ErrorKind::kConnection, "peer " + peer + " closed the endpoint", false);
      return;
    }
    if (h.kind == OfiFrameKind::kRailDown) {
      if (h.message.route < self->rails_.size()) {
        self->rail_failed(h.message.route, "the peer's end failed: " + peer_text(meta), false);
      }
      continue;
    }
    if (h.kind >= OfiFrameKind::kRejoin) {
      self->on_heal_frame(h, meta);
      continue;
    }
    CtrlMessage message = h.message;
    message.meta = std::move(meta);
    message.data = std::move(data);
    if (self->is_closed()) return;
    if (auto events = self->events()) events->on_ctrl(std::move(message));
  }
  if (auto self = weak.lock()) {
    self->shut(ErrorKind::kConnection, "connection to " + peer + " lost: the peer " + why, false);
  }
}

const OfiRegion& OfiChannel::ofi_region(const std::shared_ptr<MemoryRegion>& local,
                                        const char* what) const {
  const auto* region = dynamic_cast<const OfiRegion*>(local.get());
  if (region == nullptr) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + ": the local memory is not registered with this ofi engine");
  }
  return *region;
}

RequestPtr OfiChannel::new_request(OpKind op, uint64_t bytes) {
  return std::make_shared<Request>(transport_.next_request_id(), op, bytes);
}

ChannelLimits OfiChannel::limits() const {
  ChannelLimits l;
  l.eager_limit = kEagerLimit;
  l.ctrl_room = OfiFrameHeader::kMaxMeta;
  l.credit_window = 0;  // the bootstrap stream's own flow control bounds the peer
  return l;
}

void OfiChannel::check_open_locked() const {
  if (closed_) {
    throw Error(ErrorKind::kClosed, "endpoint to " + peer_ + " is closed (" + error_ +
                                        "); connect again to open a new endpoint");
  }
}

void OfiChannel::check_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  check_open_locked();
}

bool OfiChannel::is_closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

std::string OfiChannel::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void OfiChannel::track(const RequestPtr& request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
    inflight_[request->id()] = request;
  }
  std::weak_ptr<OfiChannel> weak = weak_from_this();
  request->then([weak](const Request& done) {
    if (auto self = weak.lock()) {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->inflight_.erase(done.id());
      for (auto& parts : self->done_parts_) parts.erase(done.id());
    }
  });
}

void OfiChannel::post_part(OpKind op, const RequestPtr& request,
                           const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                           uint64_t length, size_t rail, const PartTarget& target) {
  auto part = std::make_unique<OfiOp>();
  part->hold = RegionUse(local);
  std::weak_ptr<OfiChannel> weak = weak_from_this();
  part->done = [weak, op, request, local, offset, length, rail, target](
                   int err, int prov_errno, const std::string& text) {
    if (auto self = weak.lock()) {
      self->part_done(op, request, local, offset, length, rail, target, err, prov_errno, text);
    } else if (err == 0) {
      request->note_progress(length);
      request->part_done();
    } else {
      request->fail(ErrorKind::kClosed, "the endpoint was dropped: " + text);
    }
  };
  const char* what = op == OpKind::kRead ? "READ" : "WRITE";
  void* desc = ofi_region(local, what).desc(rail);
  uint8_t* buf = local->addr() + offset;
  // While the provider's queue is full: stop when the endpoint closed, or when the peer hung up
  // (this may run on the stream's reader thread, which would otherwise see the EOF only later).
  auto give_up = [weak] {
    auto self = weak.lock();
    if (!self || self->is_closed()) return true;
    pollfd p{self->fd_->get(), POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  };
  const OfiPeerRail& r = rails_[rail];
  const uint32_t key = (*target.keys)[rail];
  meter_.posted(rail, length, RailMeter::Clock::now());
  try {
    if (op == OpKind::kRead) {
      r.domain->post_read(std::move(part), buf, length, desc, r.peer, target.remote, key,
                          give_up);
    } else {
      r.domain->post_write(std::move(part), buf, length, desc, r.peer, target.remote, key,
                           target.notified ? &target.token : nullptr, give_up);
    }
  } catch (const Error&) {
    meter_.unposted(rail, length);
    throw;
  }
}

void OfiChannel::part_done(OpKind op, const RequestPtr& request,
                           const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                           uint64_t length, size_t rail, const PartTarget& target, int err,
                           int prov_errno, const std::string& text) {
  std::string failure = text;
  if (err != 0) meter_.unposted(rail, length);
  if ((err != 0 || target.moves > 0) && log::enabled(log::Level::kDebug)) {
    log::write(log::Level::kDebug,
               "ofi part " + std::string(op == OpKind::kRead ? "READ" : "WRITE") + " of " +
                   std::to_string(length) + " bytes at local " +
                   std::to_string(reinterpret_cast<uint64_t>(local->addr()) + offset) + " on " +
                   rails_[rail].domain->settings().domain + " (moved " +
                   std::to_string(target.moves) + "x): " + (err == 0 ? "done" : text));
  }
  if (err == 0) {
    meter_.completed(rail, length, RailMeter::Clock::now());
    const uint64_t carried = rail_bytes_[rail] += length;
    if (rail != test_err_rail_ || carried < test_err_bytes_ || test_err_fired_.exchange(true)) {
      if (!keep_done(op, request, local, offset, length, rail, target)) return;
      test_lost_read(op, local, offset, length, rail, carried);
      if (!target.counted) request->note_progress(length);
      request->part_done();
      return;
    }
    err = FI_EIO;  // RDMAXFER_OFI_TEST_RAIL_ERR: this rail fails here (its bytes landed)
    failure = "the rail failed (RDMAXFER_OFI_TEST_RAIL_ERR)";
  }
  const char* what = op == OpKind::kRead ? "READ" : "WRITE";
  const std::string on = " on " + rails_[rail].domain->settings().domain;
  if (err == kOfiEngineClosed) {
    request->fail(ErrorKind::kClosed, std::string(what) + " with " + peer_ + ": " + failure);
    return;
  }
  const ErrorKind kind = ofi_completion_kind(err, prov_errno);
  std::string why;
  if (kind == ErrorKind::kRemoteAccess) {
    why = ": the peer refused the access (no registered region has this key, or the range or "
          "the rights do not fit it)";
    // tcp;ofi_rxm cancels an RMA whose connection ended with the same error
    if (err == FI_ECANCELED) why += ", or its connection ended (the provider tells neither apart)";
  }
  const std::string message =
      std::string(what) + " with " + peer_ + (rails_.size() > 1 ? on : "") + ": " + failure + why;
  // A rail failure: a connection error, or a transport error where another rail may take the
  // part, once: a part that fails again after it moved fails its request alone (the error may
  // be the request's own), as one rail's transport error always did.
  const bool rail_failure =
      kind == ErrorKind::kConnection ||
      (kind == ErrorKind::kTransport && rails_.size() > 1 && target.moves == 0);
  if (!rail_failure) {
    request->fail(kind, message);
    return;
  }
  bool others = false;
  for (size_t i = 0; i < rails_.size(); ++i) others = others || (i != rail && rail_live(i));
  if (!others) {
    // The last live rail: the endpoint closes; the request fails first, with its own cause.
    request->fail(ErrorKind::kConnection, message);
    rail_failed(rail, message, true);
    return;
  }
  // The rail is marked failed (and the peer told) before the request fails or moves, so that a
  // caller who writes again finds it failed on both sides.
  if (!rail_failed(rail, message, true) || is_closed()) {
    request->fail(ErrorKind::kConnection, message + " (the endpoint closed)");
    return;
  }
  if (target.notified) {
    request->fail(ErrorKind::kConnection,
                  message + " (a notified write stays on its grant's rail: write again)");
    return;
  }
  PartTarget moved = target;
  ++moved.moves;
  move_part(op, request, local, offset, length, moved,
            message + "; no live rail reaches the remote memory");
}

RequestPtr OfiChannel::one_sided(OpKind op, const std::shared_ptr<MemoryRegion>& local,
                                 uint64_t local_offset, const Descriptor& remote,
                                 uint64_t remote_offset, uint64_t length,
                                 const TransferOptions& options) {
  const bool write = op == OpKind::kWrite;
  const char* what = write ? "WRITE" : "READ";
  check_local_range(local, local_offset, length, what,
                    write ? LocalUse::kSource : LocalUse::kDestination);
  check_remote_range(remote, remote_offset, length, what);
  if (remote.transport != transport_.capabilities().wire_id) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + ": the descriptor names memory of a " +
                    transport_id_name(remote.transport) +
                    " engine; an ofi endpoint reaches memory registered with an ofi engine");
  }
  check_peer_engine(remote, what);
  ofi_region(local, what);
  const uint32_t right = write ? kAccessRemoteWrite : kAccessRemoteRead;
  if ((remote.access & right) == 0) {
    // The descriptor says so (and the peer's MR would refuse it): nothing is posted.
    throw Error(ErrorKind::kRemoteAccess,
                std::string(what) + " refused: the remote region does not allow remote " + what +
                    " (registered without '" + (write ? "w" : "r") + "')");
  }
  auto request = new_request(op, length);
  count_when_terminal(request, write ? "write" : "read");
  track(request);
  if (length == 0) {
    request->complete();
    return request;
  }
  auto keys = std::make_shared<std::vector<uint32_t>>();
  for (size_t i = 0; i < rails_.size(); ++i) keys->push_back(remote.key_on(i));
  const std::vector<size_t> live = live_rails(*keys);
  if (live.empty()) {
    const std::string why = "no live rail of the endpoint to " + peer_ +
                            " reaches the remote memory (rails: " + rails_text() + ")";
    request->fail(ErrorKind::kConnection, std::string(what) + ": " + why);
    return request;
  }
  // Without FI_MR_VIRT_ADDR a remote address is the offset from the region's start (the
  // descriptor's address).
  const uint64_t base = domain_->settings().mr_virt_addr ? remote.addr + remote_offset
                                                         : remote_offset;
  const auto split = length >= kStripeMin && live.size() > 1
                         ? shares(live, length)
                         : std::vector<std::tuple<size_t, uint64_t, uint64_t>>{
                               {pick_rail(live, *local, length), 0, length}};
  std::vector<ChunkPlan> plans;
  uint64_t parts = 0;
  for (const auto& [rail, at, bytes] : split) {
    plans.push_back(plan_chunks(bytes, 1, options, max_chunk_));
    parts += plans.back().count;
  }
  request->set_parts(parts);
  try {
    for (size_t s = 0; s < split.size(); ++s) {
      const auto& [rail, at, bytes] = split[s];
      for (uint64_t i = 0; i < plans[s].count; ++i) {
        const uint64_t off = at + i * plans[s].chunk;
        const uint64_t n = std::min(plans[s].chunk, at + bytes - off);
        post_part(op, request, local, local_offset + off, n, rail,
                  PartTarget{base + off, keys, false, 0, 0});
      }
    }
  } catch (const Error& e) {
    request->fail(e);
  }
  return request;
}

RequestPtr OfiChannel::post_write(const std::shared_ptr<MemoryRegion>& local,
                                  uint64_t local_offset, const Descriptor& remote,
                                  uint64_t remote_offset, uint64_t length,
                                  const TransferOptions& options) {
  return one_sided(OpKind::kWrite, local, local_offset, remote, remote_offset, length, options);
}

RequestPtr OfiChannel::post_read(const std::shared_ptr<MemoryRegion>& local,
                                 uint64_t local_offset, const Descriptor& remote,
                                 uint64_t remote_offset, uint64_t length,
                                 const TransferOptions& options) {
  return one_sided(OpKind::kRead, local, local_offset, remote, remote_offset, length, options);
}

uint64_t OfiChannel::parts_of(uint64_t length) const {
  return length == 0 ? 1 : (length + notify_chunk_ - 1) / notify_chunk_;
}

Grant OfiChannel::grant(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                        uint64_t length, uint32_t value, const RequestPtr& progress) {
  ofi_region(local, "RECV");
  uint8_t* dst = local->addr() + offset;
  GrantHold g;
  g.hold = RegionUse(local);
  g.value = value;
  g.length = length;
  g.parts = parts_of(length);
  g.progress = progress;
  const size_t rail = grant_rail();
  uint32_t key = ofi_region(local, "RECV").key_on(rail);
  uint64_t base = reinterpret_cast<uint64_t>(local->addr());
  if ((local->access() & kAccessRemoteWrite) == 0 && length > 0) {
    // The peer writes straight into dst: register the window alone for remote write.
    g.temp = transport_.register_mr(rail, dst, length, kAccessLocalWrite | kAccessRemoteWrite,
                                    &key);
    base = reinterpret_cast<uint64_t>(dst);
  }
  const uint32_t token = transport_.add_grant(weak_from_this(), rail);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      transport_.drop_grant(token);
      check_open_locked();
    }
    grants_[token] = std::move(g);
  }
  const uint64_t addr = domain_->settings().mr_virt_addr ? reinterpret_cast<uint64_t>(dst)
                                                         : reinterpret_cast<uint64_t>(dst) - base;
  return Grant{token, addr, key, token};
}

void OfiChannel::release_grant(uint64_t id) {
  GrantHold released;  // its MR closes outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = grants_.find(static_cast<uint32_t>(id));
    if (it == grants_.end()) return;
    released = std::move(it->second);
    grants_.erase(it);
  }
  transport_.drop_grant(static_cast<uint32_t>(id));
}

void OfiChannel::on_landed(uint32_t token) {
  uint32_t value = 0;
  bool whole = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = grants_.find(token);
    if (it == grants_.end() || closed_) return;
    GrantHold& g = it->second;
    if (g.landed >= g.parts) return;  // more parts than the grant has: ignored
    ++g.landed;
    const uint64_t off = (g.landed - 1) * notify_chunk_;
    if (g.progress) g.progress->note_progress(std::min(notify_chunk_, g.length - std::min(g.length, off)));
    whole = g.landed == g.parts;
    value = g.value;
  }
  if (whole) {
    if (auto events = this->events()) events->on_notify(value);
  }
}

void OfiChannel::post_write_notify(const RequestPtr& request,
                                   const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                                   uint64_t length, uint64_t addr, uint32_t key, uint32_t route,
                                   uint32_t /*value: the target's grant holds it*/,
                                   const TransferOptions& /*options: parts of notify_chunk*/) {
  check_local_range(local, offset, length, "WRITE");
  ofi_region(local, "WRITE");
  check_open();
  // The grant's rail: the low bits of its token (OfiTransport::add_grant), where the endpoint
  // has rails (a peer of one rail, whose records are version 1, may pick tokens freely).
  const size_t rail = rails_.size() == 1 ? 0 : route & ((1u << kOfiRailBits) - 1);
  if (rail >= rails_.size() || !rail_live(rail)) {
    const std::string name =
        rail < rails_.size() ? rails_[rail].domain->settings().domain : std::to_string(rail);
    request->fail(ErrorKind::kConnection,
                  "WRITE with notification to " + peer_ + ": the grant's rail " + name +
                      " is not live on this endpoint (rails: " + rails_text() +
                      "); write again: the next grant takes a live rail");
    return;
  }
  const uint64_t parts = parts_of(length);
  request->set_parts(parts);
  auto keys = std::make_shared<std::vector<uint32_t>>(rails_.size(), 0);
  (*keys)[rail] = key;
  try {
    for (uint64_t i = 0; i < parts; ++i) {
      const uint64_t off = i * notify_chunk_;
      const uint64_t n = std::min(notify_chunk_, length - std::min(length, off));
      post_part(OpKind::kWrite, request, local, offset + off, n, rail,
                PartTarget{addr + off, keys, true, route, 0});
    }
  } catch (const Error& e) {
    request->fail(e);
  }
}

void OfiChannel::send_frame(const OfiFrameHeader& header, const std::string& meta,
                            const uint8_t* data, double timeout_s) {
  uint8_t raw[OfiFrameHeader::kSize];
  header.pack(raw);
  const std::string what = "sending a control message to " + peer_;
  std::unique_lock<std::timed_mutex> lock(send_mu_, std::defer_lock);
  if (!lock.try_lock_for(std::chrono::duration<double>(timeout_s))) {
    throw Error(ErrorKind::kTimeout, what + ": another message held the stream for " +
                                         std::to_string(timeout_s) + " s");
  }
  const Deadline deadline(timeout_s);  // a peer that stops reading its control stream
  send_exact(fd_->get(), raw, sizeof(raw), deadline, what.c_str(), tls_.get());
  send_exact(fd_->get(), meta.data(), meta.size(), deadline, what.c_str(), tls_.get());
  send_exact(fd_->get(), data, header.data_len, deadline, what.c_str(), tls_.get());
}

void OfiChannel::send_ctrl(const CtrlMessage& message, CtrlPayload payload) {
  check_open();
  if (message.meta.size() > OfiFrameHeader::kMaxMeta ||
      payload.length > OfiFrameHeader::kMaxData) {
    throw Error(ErrorKind::kInvalidArgument,
                "control message of " + std::to_string(message.meta.size()) +
                    " bytes of metadata and " + std::to_string(payload.length) +
                    " bytes of data exceeds the ofi channel's room");
  }
  OfiFrameHeader h;
  h.kind = OfiFrameKind::kCtrl;
  h.message = message;
  h.meta_len = static_cast<uint32_t>(message.meta.size());
  h.data_len = static_cast<uint32_t>(payload.length);
  try {
    send_frame(h, message.meta, payload.data, kSendTimeoutS);
  } catch (const Error& e) {
    shut(ErrorKind::kConnection, e.what(), false);
    throw;
  }
}

void OfiChannel::close() { shut(ErrorKind::kClosed, "closed locally", true); }

void OfiChannel::abort(ErrorKind kind, const std::string& reason) { shut(kind, reason, false); }

void OfiChannel::shut(ErrorKind kind, const std::string& reason, bool goodbye) {
  std::vector<RequestPtr> pending;
  std::unordered_map<uint32_t, GrantHold> grants;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    error_ = reason;
    for (auto& [id, weak] : inflight_) {
      if (auto r = weak.lock()) pending.push_back(std::move(r));
    }
    inflight_.clear();
    grants.swap(grants_);
  }
  for (const auto& [token, g] : grants) transport_.drop_grant(token);
  if (goodbye) {
    OfiFrameHeader h;
    h.kind = OfiFrameKind::kGoodbye;
    try {
      send_frame(h, "", nullptr, kSendTimeoutS);
    } catch (const Error&) {
      // The peer is gone already: nothing to tell.
    }
  }
  ::shutdown(fd_->get(), SHUT_RDWR);
  const log::Level level = connection_end_level(kind);
  if (log::enabled(level)) {
    log::write(level, "ofi endpoint to " + peer_ + " closed (" + error_kind_name(kind) +
                          "): " + reason);
  }
  for (const auto& r : pending) r->fail(kind, "endpoint to " + peer_ + " closed: " + reason);
  if (auto events = this->events()) events->on_closed(Error(kind, reason));
}

}  // namespace rdmaxfer
