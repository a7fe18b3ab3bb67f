#include "transport/shm/shm_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/deadline.h"
#include "common/error.h"
#include "transport/shm/cma_copy.h"
#include "transport/shm/shm_transport.h"

namespace rdmaxfer {

namespace {

// After the last waiter stopped driving, the doorbell stays unarmed this long (the next
// operation's acknowledgement, if it comes before its waiter drives, then waits in the ring for
// that waiter instead of waking the reader); the reader sleeps at most this long meanwhile, and
// then takes the ring back.
constexpr auto kHandBack = std::chrono::milliseconds(2);

// A record that finds the peer's ring full waits at most this long for room.
constexpr double kFullRingTimeoutS = 30.0;


}  // namespace

ShmChannel::ShmChannel(ShmTransport& transport, UniqueFd sock, std::string peer, pid_t peer_pid)
    : OneSidedChannel(transport.stats()),
      transport_(transport),
      sock_(std::move(sock)),
      peer_(std::move(peer)),
      peer_pid_(peer_pid),
      reader_linger_(transport.poll_mode(), SpinBudget::Kind::kLinger, transport.stats()),
      ipc_(peer_pid == getpid()) {}

RequestPtr ShmChannel::new_request(OpKind op, uint64_t bytes) {
  auto req = std::make_shared<Request>(transport_.next_request_id(), op, bytes);
  req->set_progress(weak_from_this());  // a waiting thread reads the ring (drive())
  return req;
}

ChannelLimits ShmChannel::limits() const {
  ChannelLimits l;
  l.eager_limit = kEagerLimit;
  l.ctrl_room = kCtrlRoom;
  l.credit_window = kCreditWindow;
  return l;
}

std::vector<std::pair<std::string, uint64_t>> ShmChannel::attributes() const {
  return {{"peer_pid", static_cast<uint64_t>(peer_pid_)},
          {"ring_bytes", kRingBytes},
          {"cuda_ipc_bytes", ipc_bytes_.load()},
          {"cuda_ipc_opened", ipc_.opened()},
          {"cuda_ipc_closed_stale", ipc_.closed_stale()}};
}

void ShmChannel::check_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  state_.check_open(peer_);
}

void ShmChannel::start_reader() {
  transport_.reader_started();
  std::thread([self = shared_from_this()]() mutable {
    self->run_reader();
    self->release_fds();
    ShmTransport& transport = self->transport_;
    self.reset();
    // Last: the transport's shutdown waits for this before it is destroyed.
    transport.reader_finished();
  }).detach();
}

void ShmChannel::push(const FrameHeader& h, const std::string& meta, const uint8_t* data,
                      uint64_t len) {
  uint8_t head[FrameHeader::kSize];
  h.encode(head);
  const Deadline deadline(kFullRingTimeoutS);
  std::lock_guard<std::mutex> lock(out_mu_);
  if (!out_) throw Error(ErrorKind::kConnection, "connection to " + peer_ + " is closed");
  if (FrameHeader::kSize + meta.size() + len > out_->max_record()) {
    throw Error(ErrorKind::kInvalidArgument, "shm: a record of " + std::to_string(len) +
                                                 " bytes exceeds the ring");
  }
  while (!out_->try_push(head, sizeof(head), meta.data(), meta.size(), data, len)) {
    if (is_closed()) throw Error(ErrorKind::kConnection, "connection to " + peer_ + " is closed");
    if (deadline.expired()) {
      throw Error(ErrorKind::kTimeout, "shm: the ring to " + peer_ + " stayed full for " +
                                           seconds_text(kFullRingTimeoutS) +
                                           " s (the peer stopped reading)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void ShmChannel::track(uint64_t op, Pending pending) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_.closed()) {
    pending.request->fail(ErrorKind::kConnection,
                          "connection to " + peer_ + " is closed (" + state_.reason() + ")");
    return;
  }
  pending_.emplace(op, std::move(pending));
}

void ShmChannel::start_one_sided(OpKind op_kind, const RequestPtr& req,
                                 const std::shared_ptr<MemoryRegion>& local,
                                 uint64_t local_offset, const Descriptor& remote,
                                 uint64_t remote_offset, uint64_t length,
                                 const TransferOptions& /*options*/) {
  const FrameType type = op_kind == OpKind::kWrite ? FrameType::kWrite : FrameType::kReadReq;
  if (length == 0) {
    req->complete();
    return;
  }
  const uint64_t op = next_op_.fetch_add(1);
  const std::string meta = name_of(*local, local->addr() + local_offset);
  track(op, Pending{req, RegionUse(local), type, !meta.empty(), nullptr, 0});
  FrameHeader h;
  h.type = type;
  h.req_id = op;
  h.addr = remote.addr + remote_offset;
  h.key = remote.key;
  h.size = length;
  h.total = length;
  h.aux = reinterpret_cast<uint64_t>(local->addr() + local_offset);
  h.meta_len = static_cast<uint32_t>(meta.size());
  try {
    share_vmm(*local);
    push(h, meta, nullptr, 0);
  } catch (const Error& e) {
    abort(e.kind(), "connection to " + peer_ + " failed: " + e.what());
  }
}

void ShmChannel::send_ctrl(const CtrlMessage& message, CtrlPayload payload) {
  FrameHeader h;
  h.type = frame_type_of(message.type);
  h.req_id = message.msg_id;
  h.size = message.size;
  h.addr = message.addr;
  h.key = message.key;
  h.meta_len = static_cast<uint32_t>(message.meta.size());
  h.payload_len = payload.length;
  try {
    push(h, message.meta, payload.data, payload.length);
  } catch (const Error& e) {
    abort(e.kind(), "connection to " + peer_ + " failed: " + e.what());
  }
}

Grant ShmChannel::grant(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                        uint64_t length, uint32_t value, const RequestPtr& progress) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.check_open(peer_);
  return grants_.add(local, offset, length, value, progress);
}

void ShmChannel::release_grant(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  grants_.release(id);
}

void ShmChannel::post_write_notify(const RequestPtr& request,
                                   const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                                   uint64_t length, uint64_t addr, uint32_t key,
                                   uint32_t /*route: one path*/, uint32_t value,
                                   const TransferOptions& /*options*/) {
  const uint64_t op = next_op_.fetch_add(1);
  const std::string meta = name_of(*local, local->addr() + offset);
  track(op, Pending{request, RegionUse(local), FrameType::kMsgData, !meta.empty(), nullptr, 0});
  FrameHeader h;
  h.type = FrameType::kMsgData;
  h.req_id = op;
  h.status = value;
  h.addr = addr;
  h.key = key;
  h.size = length;
  h.total = length;
  h.aux = reinterpret_cast<uint64_t>(local->addr() + offset);
  h.meta_len = static_cast<uint32_t>(meta.size());
  try {
    share_vmm(*local);
    push(h, meta, nullptr, 0);
  } catch (const Error& e) {
    abort(e.kind(), "connection to " + peer_ + " failed: " + e.what());
  }
}

// -- the reader ----------------------------------------------------------------------------

bool ShmChannel::try_consuming() {
  bool expected = false;
  return consuming_.compare_exchange_strong(expected, true, std::memory_order_acquire);
}

void ShmChannel::stop_consuming() { consuming_.store(false, std::memory_order_release); }

bool ShmChannel::consume(bool wait) {
  if (!try_consuming()) {
    if (!wait) return false;
    while (!try_consuming()) std::this_thread::yield();
  }
  bool any = false;
  try {
    std::string record;
    while (in_ && in_->try_pop(&record)) {
      on_record(record);
      any = true;
    }
  } catch (...) {
    stop_consuming();
    throw;
  }
  stop_consuming();
  return any;
}

void ShmChannel::run_reader() {
  try {
    int64_t idle_since = 0;  // when the ring was found empty after the last records (0: not)
    for (;;) {
      // While a waiter drives, it reads the ring; the reader only watches for the peer's end.
      if (drivers_.load() == 0) {
        if (consume()) {
          if (idle_since != 0) reader_linger_.record(steady_ns() - idle_since);
          idle_since = 0;
          continue;
        }
        if (idle_since == 0) idle_since = steady_ns();
        const int64_t linger = reader_linger_.spin_ns();
        const int64_t spin_from = steady_ns();
        bool got = false;
        for (unsigned turn = 0; drivers_.load(std::memory_order_relaxed) == 0 &&
                                steady_ns() - idle_since < linger;
             ++turn) {
          if (!in_->empty()) {
            got = true;
            break;
          }
          // The peer's thread that waits for our answer may need this CPU: let it run.
          spin_pause(turn);
        }
        if (linger > 0) reader_linger_.spun(steady_ns() - spin_from);
        if (got) continue;
      }
      if (!sleep_until_work()) {
        // The peer closed or died: what it sent before is still delivered.
        consume(/*wait=*/true);
        shut(ErrorKind::kConnection,
             "connection to " + peer_ + " lost: the peer closed the endpoint or exited");
        return;
      }
      if (is_closed()) return;
    }
  } catch (const Error& e) {
    shut(e.kind() == ErrorKind::kClosed ? ErrorKind::kConnection : e.kind(),
         "connection to " + peer_ + " failed: " + e.what());
  }
}

bool ShmChannel::sleep_until_work() {
  // The doorbell is armed only while no waiter drives, nor did just before: a driver reads the
  // ring itself. Unarmed, the reader sleeps only until the hand-back is due.
  const int64_t wait_ns = drivers_.load() > 0
                              ? std::chrono::nanoseconds(kHandBack).count()
                              : hand_back_ns_.load() - steady_ns();
  const bool arm = wait_ns <= 0;
  if (arm) {
    in_->set_sleeping(true);
    if (!in_->empty()) {
      in_->set_sleeping(false);
      return true;
    }
  }
  const int timeout_ms = arm ? 1000 : static_cast<int>((wait_ns + 999999) / 1000000);
  pollfd fds[2] = {{in_->doorbell_fd(), POLLIN, 0}, {sock_.get(), POLLIN, 0}};
  // Bounded: wakes every second even without a doorbell (a lost wake costs at most that).
  const int rc = poll(fds, 2, timeout_ms);
  if (arm) in_->set_sleeping(false);
  if (rc < 0 && errno != EINTR) throw_errno(ErrorKind::kConnection, "shm: poll", errno);
  if (rc > 0 && (fds[0].revents & POLLIN) != 0) in_->drain_doorbell();
  if (rc > 0 && fds[1].revents != 0) {
    std::lock_guard<std::mutex> lock(sock_mu_);
    if (!read_socket()) return false;
  }
  return !is_closed() || !in_->empty();
}

double ShmChannel::drive(const std::atomic<bool>& terminal, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const int64_t spin_ns = transport_.wait_budget().spin_ns();
  if (timeout_s <= 0 || spin_ns <= 0 || is_closed()) return timeout_s;
  const double spin_s = std::min(timeout_s, static_cast<double>(spin_ns) * 1e-9);
  const Clock::time_point start = Clock::now();
  const Clock::time_point until =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spin_s));
  // A reader asleep on the armed doorbell may still be rung once; from its next sleep on, it
  // leaves the doorbell unarmed until the hand-back (sleep_until_work).
  drivers_.fetch_add(1);
  unsigned idle = 0;
  try {
    while (!terminal.load(std::memory_order_acquire)) {
      if (consume()) {
        idle = 0;
        continue;
      }
      // Look at the clock now and then only, and give the CPU away now and then while the ring
      // stays empty: the peer may need it to answer.
      if (++idle % 16 == 0 && Clock::now() >= until) break;
      spin_pause(idle);
    }
  } catch (const Error& e) {
    shut(e.kind() == ErrorKind::kClosed ? ErrorKind::kConnection : e.kind(),
         "connection to " + peer_ + " failed: " + e.what());
  }
  stop_driving();
  if (terminal.load(std::memory_order_acquire)) return 0.0;
  return std::max(0.0, timeout_s - std::chrono::duration<double>(Clock::now() - start).count());
}

void ShmChannel::waited(int64_t waited_ns) { transport_.wait_budget().record(waited_ns); }

void ShmChannel::stop_driving() {
  // The reader takes the ring back once the hand-back is due (sleep_until_work).
  hand_back_ns_.store(steady_ns() + std::chrono::nanoseconds(kHandBack).count());
  drivers_.fetch_sub(1);
}

void ShmChannel::on_record(const std::string& record) {
  if (record.size() < FrameHeader::kSize) throw Error(ErrorKind::kProtocol, "short shm record");
  const FrameHeader h = FrameHeader::decode(reinterpret_cast<const uint8_t*>(record.data()));
  if (FrameHeader::kSize + uint64_t{h.meta_len} + h.payload_len != record.size()) {
    throw Error(ErrorKind::kProtocol, "shm record length differs from its header");
  }
  const std::string meta = record.substr(FrameHeader::kSize, h.meta_len);
  // Acknowledgements complete this side's requests; anything else the peer sent is handled
  // after the groups before it (or with them, for groups of the same kind).
  if (h.type != FrameType::kWriteAck && h.type != FrameType::kReadResp &&
      h.type != FrameType::kWriteGatherAck) {
    wait_gathers(h.type);
  }
  switch (h.type) {
    case FrameType::kWrite:
    case FrameType::kReadReq: serve_copy(h, meta); return;
    case FrameType::kMsgData: serve_notified_write(h, meta); return;
    case FrameType::kWriteAck:
    case FrameType::kReadResp: on_ack(h, meta); return;
    case FrameType::kWriteGather:
    case FrameType::kReadGather: serve_gather(h, record); return;
    case FrameType::kWriteGatherAck: on_gather_ack(h, meta); return;
    case FrameType::kMsgRts:
    case FrameType::kMsgEager:
    case FrameType::kMsgCts:
    case FrameType::kMsgReject:
    case FrameType::kMsgNotify:
    case FrameType::kMsgAbort: {
      CtrlMessage m;
      m.type = ctrl_type_of(h.type);
      if (m.type == CtrlType::kEager && h.payload_len != h.size) {
        throw Error(ErrorKind::kProtocol, "eager data length differs from the message size");
      }
      m.msg_id = h.req_id;
      m.size = h.size;
      m.addr = h.addr;
      m.key = h.key;
      m.meta = meta;
      m.data = record.substr(FrameHeader::kSize + h.meta_len);
      stats_->add_lane(0, h.payload_len);
      events()->on_ctrl(std::move(m));
      return;
    }
    default: throw Error(ErrorKind::kProtocol, "unexpected shm record type");
  }
}

std::string ShmChannel::name_of(const MemoryRegion& local, const uint8_t* addr) {
  const IpcDeviceRegion* device = ipc_device_region(&local);
  return device != nullptr ? device->wire_name(addr) : std::string();
}

int ShmChannel::move(const MemoryRegion& region, const std::string& meta, bool pull,
                     uint8_t* local, uint64_t remote, uint64_t length) {
  if (!meta.empty()) {
    ipc_.copy(meta, remote, region, local, length, pull,
              [this](uint64_t id) { return take_vmm_fd(id); });
    ipc_bytes_.fetch_add(length);
    return 0;
  }
  const CmaDirection direction = pull ? CmaDirection::kPull : CmaDirection::kPush;
  if (const IpcDeviceRegion* device = ipc_device_region(&region)) {
    return cma_device_copy(peer_pid_, direction, *device, local, remote, length);
  }
  return cma_copy(peer_pid_, direction, local, remote, length);
}

void ShmChannel::serve_copy(const FrameHeader& h, const std::string& meta) {
  const bool write = h.type == FrameType::kWrite;
  RegionUse use;
  AccessStatus status = transport_.domain().regions().acquire(
      h.key, h.addr, h.size, write ? kAccessRemoteWrite : kAccessRemoteRead, &use);
  FrameHeader ack;
  ack.type = write ? FrameType::kWriteAck : FrameType::kReadResp;
  ack.req_id = h.req_id;
  ack.status = static_cast<uint32_t>(status);
  std::string failure;
  if (status == AccessStatus::kOk) {
    auto* target = reinterpret_cast<uint8_t*>(h.addr);
    try {
      const int err = move(*use.get(), meta, write, target, h.aux, h.size);
      ack.aux = static_cast<uint64_t>(err);
      if (err == 0) stats_->add_lane(0, h.size);
    } catch (const Error& e) {
      ack.aux = EIO;
      failure = e.what();
    }
  }
  ack.meta_len = static_cast<uint32_t>(failure.size());
  push(ack, failure, nullptr, 0);
}

void ShmChannel::serve_notified_write(const FrameHeader& h, const std::string& meta) {
  GrantEntry g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const GrantEntry* found = grants_.find(h.key);
    if (found == nullptr) {
      throw Error(ErrorKind::kProtocol, "a write with notification for no grant");
    }
    g = *found;
  }
  if (h.addr != reinterpret_cast<uint64_t>(g.base) || h.size != g.length || h.status != g.value) {
    throw Error(ErrorKind::kProtocol, "a write with notification outside the grant it names");
  }
  std::string failure;
  const int err = [&] {
    RegionUse use(g.region);
    try {
      return move(*g.region, meta, /*pull=*/true, g.base, h.aux, h.size);
    } catch (const Error& e) {
      failure = e.what();
      return EIO;
    }
  }();
  FrameHeader ack;
  ack.type = FrameType::kWriteAck;
  ack.req_id = h.req_id;
  ack.aux = static_cast<uint64_t>(err);
  if (err != 0) {
    ack.meta_len = static_cast<uint32_t>(failure.size());
    push(ack, failure, nullptr, 0);
    throw Error(ErrorKind::kConnection, failure.empty()
                                            ? cma_failure("process_vm_readv", err, peer_)
                                            : "CUDA IPC copy failed: " + failure);
  }
  stats_->add_lane(0, h.size);
  if (g.progress) g.progress->note_progress(h.size);
  push(ack, "", nullptr, 0);
  events()->on_notify(g.value);
}

bool ShmChannel::take_pending(uint64_t op, Pending* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(op);
  if (it == pending_.end()) return false;
  *out = std::move(it->second);
  pending_.erase(it);
  return true;
}

void ShmChannel::on_ack(const FrameHeader& h, const std::string& meta) {
  Pending p;
  if (!take_pending(h.req_id, &p)) return;  // failed by a close that raced with the answer
  const auto status = static_cast<AccessStatus>(h.status);
  if (status != AccessStatus::kOk) {
    p.request->fail(ErrorKind::kRemoteAccess,
                    "peer " + peer_ + " refused access to " + std::to_string(p.request->bytes()) +
                        " bytes: " + access_status_text(status) +
                        " (check the descriptor, remote_offset and length)");
  } else if (!meta.empty()) {
    p.request->fail(ErrorKind::kTransport, "peer " + peer_ + ": CUDA IPC copy failed: " + meta);
  } else if (h.aux != 0) {
    const bool pushed = p.type == FrameType::kReadReq;
    p.request->fail(ErrorKind::kTransport,
                    cma_failure(pushed ? "process_vm_writev" : "process_vm_readv",
                                 static_cast<int>(h.aux), peer_));
  } else {
    if (p.ipc) ipc_bytes_.fetch_add(p.request->bytes());
    p.request->note_progress(p.request->bytes());
    p.request->complete();
  }
}

// -- closing -------------------------------------------------------------------------------

void ShmChannel::close() { shut(ErrorKind::kClosed, "closed locally"); }

void ShmChannel::abort(ErrorKind kind, const std::string& reason) { shut(kind, reason); }

void ShmChannel::shut(ErrorKind kind, const std::string& reason) {
  std::unordered_map<uint64_t, Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!state_.close(reason)) return;
    grants_.clear();
    pending.swap(pending_);
    // The peer sees end-of-file at once; our reader wakes from its poll (and then exits).
    ::shutdown(sock_.get(), SHUT_RDWR);
  }
  for (auto& entry : pending) entry.second.request->fail(kind, reason);
  if (events()) events()->on_closed(Error(kind, reason));
}

void ShmChannel::release_fds() {
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    out_.reset();
  }
  // A driver may be reading the ring: wait for it, then keep the others out for good.
  while (!try_consuming()) std::this_thread::yield();
  in_.reset();
  ipc_.close_all();  // the peer's device memory opened here (it may have died)
  std::lock_guard<std::mutex> lock(sock_mu_);
  vmm_in_.clear();
  std::lock_guard<std::mutex> closed(mu_);
  sock_.reset();
}

bool ShmChannel::is_closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.closed();
}

std::string ShmChannel::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.reason();
}

}  // namespace rdmaxfer
