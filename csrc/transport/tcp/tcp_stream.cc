#include "transport/tcp/tcp_stream.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "transport/tcp/tcp_connection.h"

namespace rdmaxfer {

namespace {
constexpr int kMaxIov = 1024;  // IOV_MAX on Linux
constexpr size_t kScatterIov = 64;  // pieces of a WRITE_GATHER read by one recvmsg
constexpr uint64_t kReadBudget = 16ull << 20;  // per wake-up, so other streams get a turn
constexpr size_t kStage = 64 * 1024;
// What one read into the staging buffer asks for: enough for hundreds of small frames, little
// enough that the start of a large frame's data (copied from the buffer into its destination)
// costs little; the rest of a frame's data, from kDirectMin bytes on, is read in place.
constexpr size_t kStageRead = 16 * 1024;
constexpr uint64_t kDirectMin = kStageRead;
constexpr uint64_t kInlineLimit = 1024 * 1024;
// A driving thread looks at its request at least this often, even without socket events (a
// completion processed by the loop just before the stream was borrowed, a frame another thread
// queued meanwhile).
constexpr double kDrivePollS = 0.002;
}  // namespace

OutFrame make_frame(const FrameHeader& header, std::string meta) {
  OutFrame f;
  FrameHeader h = header;
  h.meta_len = static_cast<uint32_t>(meta.size());
  h.encode(f.header);
  f.meta = std::move(meta);
  return f;
}

TcpStream::TcpStream(UniqueFd fd, std::unique_ptr<TlsSession> tls, int index, IoLoop* loop,
                     std::weak_ptr<TcpConnection> conn, std::shared_ptr<Stats> stats)
    : fd_(std::move(fd)), tls_(std::move(tls)), index_(index), loop_(loop), conn_(std::move(conn)),
      stats_(std::move(stats)) {}

namespace {
// The Cork this thread holds, and the streams whose frames wait for it.
thread_local bool t_corked = false;
thread_local std::vector<std::shared_ptr<TcpStream>> t_corked_streams;
}  // namespace

Cork::Cork() {
  if (!t_corked) owner_ = t_corked = true;
}

Cork::~Cork() {
  if (!owner_) return;
  std::vector<std::shared_ptr<TcpStream>> streams;
  streams.swap(t_corked_streams);
  t_corked = false;
  for (auto& stream : streams) stream->uncork();
}

bool TcpStream::enqueue(OutFrame frame) {
  std::vector<RequestPtr> completed;
  bool corked = false;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (dead_.load()) return false;
    queued_.fetch_add(frame.total(), std::memory_order_relaxed);
    const bool small = frame.total() <= kInlineLimit;
    queue_.push_back(std::move(frame));
    if (!want_write_) {
      // Small frames go out at once from the caller's thread (latency), or when its Cork ends;
      // large ones are written by the loop thread, so the caller's thread does not copy
      // megabytes into the socket.
      corked = small && t_corked;
      if (!corked && (small || loop_->in_loop_thread())) flush_locked(&completed);
      if (!corked && !queue_.empty() && !dead_.load()) {
        want_write_ = true;
        update_watch_locked();
      }
    }
  }
  if (corked && std::find(t_corked_streams.begin(), t_corked_streams.end(),
                          shared_from_this()) == t_corked_streams.end()) {
    t_corked_streams.push_back(shared_from_this());
  }
  for (auto& r : completed) r->part_done();
  return true;
}

void TcpStream::uncork() {
  std::vector<RequestPtr> completed;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (dead_.load() || want_write_) return;  // dropped, or the loop writes the backlog
    flush_locked(&completed);
    if (!queue_.empty() && !dead_.load()) {
      want_write_ = true;
      update_watch_locked();
    }
  }
  for (auto& r : completed) r->part_done();
}

void TcpStream::flush_locked(std::vector<RequestPtr>* completed) {
  while (!queue_.empty()) {
    iovec iov[kMaxIov];
    int n_iov = 0;
    for (auto it = queue_.begin();
         it != queue_.end() && n_iov + 3 + static_cast<int>(it->gather.size()) <= kMaxIov; ++it) {
      uint64_t skip = it->sent;
      auto add = [&](const void* base, uint64_t len) {
        if (skip >= len) {
          skip -= len;
          return;
        }
        iov[n_iov].iov_base = const_cast<uint8_t*>(static_cast<const uint8_t*>(base) + skip);
        iov[n_iov].iov_len = len - skip;
        skip = 0;
        ++n_iov;
      };
      add(it->header, FrameHeader::kSize);
      if (!it->meta.empty()) add(it->meta.data(), it->meta.size());
      for (const auto& [base, len] : it->gather) add(base, len);
      if (it->data_len > 0 && it->gather.empty()) add(it->data, it->data_len);
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n_iov);
    ssize_t n = 0;
    try {
      n = tls_ ? tls_->writev(iov, n_iov) : sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    } catch (const Error& e) {
      loop_->post([self = shared_from_this(), why = std::string(e.what())] { self->fail(why, 0); });
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!blocked_) stats_->add_credit_stall();  // back-pressure: the peer reads slower
        blocked_ = true;
        return;
      }
      int e = errno;
      // Fail outside the send lock: the connection takes its own locks.
      loop_->post([self = shared_from_this(), e] { self->fail("send", e); });
      return;
    }
    uint64_t left = static_cast<uint64_t>(n);
    queued_.fetch_sub(left, std::memory_order_relaxed);
    while (left > 0 && !queue_.empty()) {
      OutFrame& f = queue_.front();
      const uint64_t rest = f.total() - f.sent;
      const uint64_t data_before = f.data_sent();
      f.sent += std::min(left, rest);
      if (f.progress && f.data_sent() > data_before) {
        // Bytes count as moved only where sending is what completes the frame's part (the
        // data of a message); a WRITE's part completes with the peer's acknowledgement.
        f.progress->note_progress(f.on_sent ? f.data_sent() - data_before : 0);
      }
      if (left < rest) {
        left = 0;
        break;
      }
      left -= rest;
      if (f.on_sent) {
        stats_->add_lane(index_, f.data_len);  // a message's data chunk, now in the socket
        completed->push_back(std::move(f.on_sent));
      }
      queue_.pop_front();
    }
    if (queue_.empty()) blocked_ = false;
    // Zero-length frames never appear: every frame has a header.
  }
}

void TcpStream::update_watch_locked() {
  const bool lent = borrowers_ > 0;
  const int watching = (lent ? 0 : 1) | (!lent && want_write_ ? 2 : 0);
  if (watching == watching_ || !fd_.valid()) return;
  watching_ = watching;
  loop_->watch(fd_.get(), (watching & 1) != 0, (watching & 2) != 0);
}

void TcpStream::flush() {
  std::vector<RequestPtr> completed;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    flush_locked(&completed);
    if (queue_.empty() && want_write_) {
      want_write_ = false;
      update_watch_locked();
    }
  }
  for (auto& r : completed) r->part_done();
}

void TcpStream::on_writable() {
  if (!borrowed_.load()) flush();  // else the borrowing thread writes
}

double TcpStream::drive(const std::atomic<bool>& terminal, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const Clock::time_point until =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  // First poll without blocking for the spin budget (the poll mode's), then sleep in poll().
  const int64_t spin_ns = loop_->wait_budget().spin_ns();
  const Clock::time_point spin_until =
      spin_ns >= std::chrono::duration_cast<std::chrono::nanoseconds>(until - start).count()
          ? until
          : start + std::chrono::nanoseconds(spin_ns);
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (dead_.load() || removed_) return timeout_s;
    if (borrowers_++ == 0) {
      borrowed_.store(true);
      update_watch_locked();
    }
  }
  bool alive = true;
  unsigned turn = 0;
  while (!terminal.load(std::memory_order_acquire)) {
    pollfd p{};
    {
      std::lock_guard<std::mutex> lock(send_mu_);
      if (dead_.load()) {
        alive = false;
        break;
      }
      p.fd = fd_.get();
      p.events = static_cast<short>(POLLIN | (queue_.empty() ? 0 : POLLOUT));
    }
    const Clock::time_point now = Clock::now();
    const double left = std::chrono::duration<double>(until - now).count();
    if (left <= 0) break;
    const bool spinning = now < spin_until;
    const int ms =
        spinning ? 0 : static_cast<int>(std::ceil(std::min(left, kDrivePollS) * 1000));
    const int n = poll(&p, 1, ms);
    if (n < 0 && errno != EINTR) {
      alive = false;  // poll itself failed (no memory): let the loop serve the stream again
      break;
    }
    if (n <= 0) {
      if (spinning) spin_pause(turn++);
      continue;
    }
    if (p.revents & POLLOUT) flush();
    if (p.revents & POLLIN) {
      receive();
    } else if (p.revents & (POLLERR | POLLHUP)) {
      on_error();
    }
  }
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (--borrowers_ == 0) {
      borrowed_.store(false);
      if (removed_) {
        fd_.reset();
      } else {
        want_write_ = !queue_.empty();
        update_watch_locked();
      }
    }
  }
  if (alive || terminal.load(std::memory_order_acquire)) return 0.0;
  return std::max(0.0, std::chrono::duration<double>(until - Clock::now()).count());
}

void TcpStream::on_error() { fail("socket error", 0); }

void TcpStream::fail(const std::string& why, int err_no) {
  if (auto conn = conn_.lock()) {
    std::string text = err_no != 0 ? errno_text(why + " on stream " + std::to_string(index_), err_no)
                                   : why + " on stream " + std::to_string(index_);
    conn->abort(ErrorKind::kConnection, "connection to " + conn->peer() + " lost: " + text);
  } else {
    retire("stream " + std::to_string(index_) + " ended: the connection is gone");
  }
}

void TcpStream::retire(const std::string& why) {
  for (auto& r : kill()) {
    r->fail(ErrorKind::kConnection, why);
  }
}

std::vector<RequestPtr> TcpStream::kill() {
  std::vector<RequestPtr> orphans;
  if (dead_.exchange(true)) return orphans;
  shutdown(fd_.get(), SHUT_RDWR);
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    for (auto& f : queue_) {
      if (f.on_sent) orphans.push_back(std::move(f.on_sent));
    }
    queue_.clear();
    queued_.store(0);
  }
  loop_->post([self = shared_from_this()] {
    {
      std::lock_guard<std::mutex> lock(self->recv_mu_);
      self->sink_ = RecvSink();
    }
    self->loop_->remove(self->fd_.get());
    // Out of the loop for good: give the descriptor back now (or when the last thread driving
    // the stream lets go of it), not when the last handle to the connection goes away.
    std::lock_guard<std::mutex> lock(self->send_mu_);
    self->removed_ = true;
    if (self->borrowers_ == 0) self->fd_.reset();
  });
  return orphans;
}

void TcpStream::on_readable() {
  if (!borrowed_.load()) receive();  // else the borrowing thread reads (an event from before)
}

void TcpStream::receive() {
  auto conn = conn_.lock();
  if (!conn) {
    retire("stream " + std::to_string(index_) + " ended: the connection is gone");
    return;
  }
  std::lock_guard<std::mutex> lock(recv_mu_);
  // What the frames read here make this thread send (acknowledgements, a batch's next WRITEs)
  // goes out together once the read is done.
  Cork cork;
  uint64_t budget = kReadBudget;
  // A read that came back short emptied the socket: stop there instead of reading again only to
  // get EAGAIN. Both watchers (the loop's epoll, a driving thread's poll) are level-triggered, so
  // bytes or an EOF that arrive later are reported again.
  bool drained = false;
  try {
    // The budget bounds reading, not consuming: bytes already staged are consumed in any case
    // (they may end the last frame the peer sends on this stream, and no later readiness
    // would bring them back). With TLS, bytes decrypted ahead (a record read in part) are
    // invisible to poll(): read on past the budget until the session holds none.
    while (!dead_.load() &&
           (budget > 0 || stage_pos_ < stage_len_ || (tls_ && tls_->pending()))) {
      if (stage_pos_ < stage_len_) {
        stage_pos_ += consume(stage_.data() + stage_pos_, stage_len_ - stage_pos_);
        continue;
      }
      if (drained) return;
      // Large data goes straight from the socket into its destination, a WRITE_GATHER's data
      // straight into its pieces; everything else (headers, metadata, small payloads, several
      // small frames at once) through the staging buffer.
      if (stage_.empty()) stage_.resize(kStage);
      const bool pieces = phase_ == Phase::kData && !sink_.scatter.empty();
      const bool direct = phase_ == Phase::kData && !sink_.discard && !pieces &&
                          header_.payload_len - data_got_ >= kDirectMin;
      iovec iov[kScatterIov];
      size_t n_iov = 1;
      // Past the budget (TLS bytes pending), a record's worth.
      const uint64_t room = budget > 0 ? budget : kStageRead;
      if (pieces) {
        n_iov = scatter_iov(iov, room);
      } else if (direct) {
        const uint64_t rest = header_.payload_len - data_got_;
        iov[0].iov_base =
            (sink_.into_owned ? reinterpret_cast<uint8_t*>(sink_.owned.data()) : sink_.dst) +
            data_got_;
        iov[0].iov_len = static_cast<size_t>(std::min(rest, room));
        if (rest <= room) {
          // The frame ends in this read: what follows it (the next frames) goes into the
          // staging buffer by the same recvmsg, and a short read tells the socket is empty.
          iov[1].iov_base = stage_.data();
          iov[1].iov_len = kStageRead;
          n_iov = 2;
        }
      } else {
        iov[0].iov_base = stage_.data();
        iov[0].iov_len = kStageRead;
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n_iov;
      size_t asked = 0;
      for (size_t i = 0; i < n_iov; ++i) asked += iov[i].iov_len;
      // TLS reads one record at a time into the first iovec (the rest of a frame's data, or the
      // staging buffer), and never drains the socket by a short read.
      ssize_t n = tls_ ? tls_->read(iov[0].iov_base, iov[0].iov_len)
                       : recvmsg(fd_.get(), &msg, MSG_DONTWAIT);
      if (n == 0) {
        // A closing peer shuts all its streams down after its last frames; those frames may
        // still be unread on stream 0 (a CTS, a GOODBYE). So only EOF on stream 0 ends the
        // connection; an earlier EOF on another stream just retires that stream.
        if (index_ == 0) {
          fail("peer closed the connection (EOF)", 0);
        } else {
          // What was queued on this stream cannot arrive: to its request the connection is lost.
          retire("connection to " + conn->peer() + " lost: the peer closed stream " +
                 std::to_string(index_) + " (EOF)");
        }
        return;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        fail("recv", errno);
        return;
      }
      drained = !tls_ && static_cast<size_t>(n) < asked;
      budget -= std::min<uint64_t>(budget, static_cast<uint64_t>(n));
      if (pieces) {
        data_got_ += static_cast<uint64_t>(n);
        scatter(nullptr, static_cast<size_t>(n));
        if (data_got_ == header_.payload_len) finish_frame();
      } else if (direct) {
        const size_t placed = std::min(static_cast<size_t>(n), iov[0].iov_len);
        data_got_ += placed;
        if (sink_.progress) sink_.progress->note_progress(placed);
        stage_pos_ = 0;
        stage_len_ = static_cast<size_t>(n) - placed;  // consumed on the next turn
        if (data_got_ == header_.payload_len) finish_frame();
      } else {
        stage_pos_ = 0;
        stage_len_ = static_cast<size_t>(n);
      }
    }
  } catch (const Error& e) {
    conn->abort(e.kind(), "connection to " + conn->peer() + " failed: " + e.what());
  }
}

size_t TcpStream::consume(const uint8_t* p, size_t n) {
  switch (phase_) {
    case Phase::kHeader: {
      const size_t take = std::min(n, FrameHeader::kSize - header_got_);
      std::memcpy(header_buf_ + header_got_, p, take);
      header_got_ += take;
      if (header_got_ == FrameHeader::kSize) {
        header_ = FrameHeader::decode(header_buf_);
        header_got_ = 0;
        meta_.assign(header_.meta_len, '\0');
        meta_got_ = 0;
        if (header_.meta_len > 0) {
          phase_ = Phase::kMeta;
        } else {
          start_payload();
        }
      }
      return take;
    }
    case Phase::kMeta: {
      const size_t take = std::min(n, meta_.size() - meta_got_);
      std::memcpy(meta_.data() + meta_got_, p, take);
      meta_got_ += take;
      if (meta_got_ == meta_.size()) start_payload();
      return take;
    }
    case Phase::kData: {
      const size_t take =
          static_cast<size_t>(std::min<uint64_t>(n, header_.payload_len - data_got_));
      if (!sink_.scatter.empty()) {
        scatter(p, take);
      } else if (!sink_.discard) {
        uint8_t* base =
            sink_.into_owned ? reinterpret_cast<uint8_t*>(sink_.owned.data()) : sink_.dst;
        std::memcpy(base + data_got_, p, take);
        if (sink_.progress) sink_.progress->note_progress(take);
      }
      data_got_ += take;
      if (data_got_ == header_.payload_len) finish_frame();
      return take;
    }
  }
  return n;
}

size_t TcpStream::scatter_iov(iovec* iov, uint64_t budget) {
  size_t n_iov = 0;
  uint64_t off = sink_.scatter_off;
  for (size_t i = sink_.scatter_at;
       i < sink_.scatter.size() && n_iov < kScatterIov && budget > 0; ++i, off = 0) {
    const auto& [base, len] = sink_.scatter[i];
    // A refused piece's bytes land in the staging buffer (empty now) and are dropped.
    const uint64_t room = base != nullptr ? len - off : std::min<uint64_t>(len - off, kStage);
    iov[n_iov].iov_base = base != nullptr ? base + off : stage_.data();
    iov[n_iov].iov_len = static_cast<size_t>(std::min(room, budget));
    budget -= iov[n_iov].iov_len;
    ++n_iov;
    if (room < len - off) break;  // the rest of that piece next time
  }
  return n_iov;
}

void TcpStream::scatter(const uint8_t* p, size_t n) {
  while (n > 0 && sink_.scatter_at < sink_.scatter.size()) {
    auto& [base, len] = sink_.scatter[sink_.scatter_at];
    const uint64_t take = std::min<uint64_t>(n, len - sink_.scatter_off);
    if (base != nullptr && p != nullptr) std::memcpy(base + sink_.scatter_off, p, take);
    if (p != nullptr) p += take;
    n -= take;
    sink_.scatter_off += take;
    if (sink_.scatter_off == len) {
      ++sink_.scatter_at;
      sink_.scatter_off = 0;
    }
  }
}

void TcpStream::start_payload() {
  auto conn = conn_.lock();
  if (!conn) return;
  sink_ = RecvSink();
  conn->choose_sink(*this, header_, meta_, &sink_);
  if (sink_.into_owned) sink_.owned.assign(header_.payload_len, '\0');
  data_got_ = 0;
  if (header_.payload_len == 0) {
    finish_frame();
  } else {
    phase_ = Phase::kData;
  }
}

void TcpStream::finish_frame() {
  phase_ = Phase::kHeader;
  auto conn = conn_.lock();
  RecvSink sink = std::move(sink_);
  sink_ = RecvSink();
  std::string meta = std::move(meta_);
  meta_.clear();
  if (conn) conn->on_frame(*this, header_, std::move(meta), std::move(sink));
}

}  // namespace rdmaxfer
