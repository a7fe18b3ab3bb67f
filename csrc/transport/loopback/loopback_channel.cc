#include "transport/loopback/loopback_channel.h"

#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "common/test_hooks.h"
#include "transport/loopback/loopback_transport.h"

namespace rdmaxfer {

LoopbackChannel::LoopbackChannel(LoopbackTransport& transport, int lanes, std::string peer)
    : OneSidedChannel(transport.stats()),
      transport_(transport),
      lanes_(lanes),
      peer_name_(std::move(peer)),
      swap_cts_(test_hooks::loopback_swap_cts()) {}

RequestPtr LoopbackChannel::new_request(OpKind op, uint64_t bytes) {
  return std::make_shared<Request>(transport_.next_request_id(), op, bytes);
}

ChannelLimits LoopbackChannel::limits() const {
  ChannelLimits l;
  l.eager_limit = kEagerLimit;
  l.ctrl_room = kCtrlRoom;
  l.credit_window = kCreditWindow;
  return l;
}

void LoopbackChannel::check_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  state_.check_open(peer_name_);
}

void LoopbackChannel::to_peer(std::function<void(LoopbackChannel&)> fn) {
  std::shared_ptr<LoopbackChannel> peer = peer_.lock();
  if (!peer) return;
  std::lock_guard<std::mutex> lock(peer->mu_);
  if (peer->state_.closed()) return;
  std::weak_ptr<LoopbackChannel> weak = peer;
  peer->transport_.deliver([weak, fn = std::move(fn)] {
    if (auto p = weak.lock()) {
      try {
        fn(*p);
      } catch (const Error& e) {
        p->abort(e.kind(), "connection to " + p->peer() + " failed: " + e.what());
      }
    }
  });
}

void LoopbackChannel::start_one_sided(OpKind op, const RequestPtr& req,
                                      const std::shared_ptr<MemoryRegion>& local,
                                      uint64_t local_offset, const Descriptor& remote,
                                      uint64_t remote_offset, uint64_t length,
                                      const TransferOptions& /*options*/) {
  const bool write = op == OpKind::kWrite;
  std::shared_ptr<LoopbackChannel> peer = peer_.lock();
  bool open = false;
  AccessStatus status = AccessStatus::kOk;
  RegionUse use;
  if (peer) {
    std::lock_guard<std::mutex> lock(peer->mu_);
    open = !peer->state_.closed();
    if (open) {
      status = peer->transport_.domain().regions().acquire(
          remote.key, remote.addr + remote_offset, length,
          write ? kAccessRemoteWrite : kAccessRemoteRead, &use);
    }
  }
  if (!open) {
    req->fail(ErrorKind::kConnection, "connection to " + peer_name_ + " is closed");
    return;
  }
  if (status != AccessStatus::kOk) {
    req->fail(ErrorKind::kRemoteAccess,
              "peer " + peer_name_ + " refused access to " + std::to_string(length) +
                  " bytes: " + access_status_text(status) +
                  " (check the descriptor, remote_offset and length)");
    return;
  }
  auto* remote_bytes = reinterpret_cast<uint8_t*>(remote.addr + remote_offset);
  uint8_t* local_bytes = local->addr() + local_offset;
  if (length > 0) {
    std::memmove(write ? remote_bytes : local_bytes, write ? local_bytes : remote_bytes, length);
  }
  stats_->add_lane(0, length);
  req->complete();
}

void LoopbackChannel::send_ctrl(const CtrlMessage& message, CtrlPayload payload) {
  CtrlMessage copy = message;
  if (payload.length > 0) copy.data.assign(reinterpret_cast<const char*>(payload.data),
                                           payload.length);
  std::optional<CtrlMessage> after;
  if (swap_cts_ && copy.type == CtrlType::kCts && !copy.meta.empty()) {
    std::lock_guard<std::mutex> lock(swap_mu_);
    const int seen = ++cts_seen_[copy.msg_id];
    if (seen == 1 && !held_cts_) {
      held_cts_ = std::move(copy);
      return;
    }
    if (held_cts_ && held_cts_->msg_id == copy.msg_id) {
      after = std::move(held_cts_);
      held_cts_.reset();
    }
  }
  to_peer([copy = std::move(copy)](LoopbackChannel& peer) mutable {
    peer.events()->on_ctrl(std::move(copy));
  });
  if (after) {
    to_peer([copy = std::move(*after)](LoopbackChannel& peer) mutable {
      peer.events()->on_ctrl(std::move(copy));
    });
  }
}

Grant LoopbackChannel::grant(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                             uint64_t length, uint32_t value, const RequestPtr& progress) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.check_open(peer_name_);
  return grants_.add(local, offset, length, value, progress);
}

void LoopbackChannel::release_grant(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  grants_.release(id);
}

bool LoopbackChannel::land(uint32_t key, uint64_t addr, uint32_t value, const uint8_t* data,
                           uint64_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  const GrantEntry* found = grants_.find(key);
  if (found == nullptr) return false;
  const GrantEntry& g = *found;
  if (addr != reinterpret_cast<uint64_t>(g.base) || length != g.length || value != g.value) {
    return false;
  }
  RegionUse use(g.region);
  if (length > 0) std::memcpy(g.base, data, length);
  return true;
}

void LoopbackChannel::post_write_notify(const RequestPtr& request,
                                        const std::shared_ptr<MemoryRegion>& local,
                                        uint64_t offset, uint64_t length, uint64_t addr,
                                        uint32_t key, uint32_t /*route: one path*/,
                                        uint32_t value, const TransferOptions& /*options*/) {
  std::shared_ptr<LoopbackChannel> peer = peer_.lock();
  if (!peer) {
    request->fail(ErrorKind::kConnection, "connection to " + peer_name_ + " is closed");
    return;
  }
  if (!peer->land(key, addr, value, local->addr() + offset, length)) {
    const std::string why = "a write with notification outside the grant it names";
    request->fail(ErrorKind::kProtocol, why);
    peer->abort(ErrorKind::kProtocol, "connection to " + peer->peer() + " failed: " + why);
    abort(ErrorKind::kProtocol, "connection to " + peer_name_ + " failed: " + why);
    return;
  }
  to_peer([value](LoopbackChannel& p) { p.events()->on_notify(value); });
  request->complete();
}

void LoopbackChannel::close() { shut(ErrorKind::kClosed, "closed locally", true); }

void LoopbackChannel::abort(ErrorKind kind, const std::string& reason) {
  shut(kind, reason, true);
}

void LoopbackChannel::shut(ErrorKind kind, const std::string& reason, bool tell_peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!state_.close(reason)) return;
    grants_.clear();
  }
  if (tell_peer) {
    to_peer([](LoopbackChannel& p) {
      p.shut(ErrorKind::kConnection, "peer " + p.peer() + " closed the endpoint", false);
    });
  }
  if (events()) events()->on_closed(Error(kind, reason));
}

bool LoopbackChannel::is_closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.closed();
}

std::string LoopbackChannel::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.reason();
}

}  // namespace rdmaxfer
