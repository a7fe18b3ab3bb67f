#include "transport/tcp/tcp_stream.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>

#include "common/error.h"
#include "transport/tcp/tcp_connection.h"

namespace rdmaxfer {

namespace {
constexpr int kMaxIov = 64;
constexpr uint64_t kReadBudget = 16ull << 20;  // per wake-up, so other streams get a turn
constexpr size_t kScratch = 256 * 1024;
}  // namespace

OutFrame make_frame(const FrameHeader& header, std::string meta) {
  OutFrame f;
  FrameHeader h = header;
  h.meta_len = static_cast<uint32_t>(meta.size());
  h.encode(f.header);
  f.meta = std::move(meta);
  return f;
}

TcpStream::TcpStream(UniqueFd fd, int index, IoLoop* loop, std::weak_ptr<TcpConnection> conn)
    : fd_(std::move(fd)), index_(index), loop_(loop), conn_(std::move(conn)) {}

bool TcpStream::enqueue(OutFrame frame) {
  std::vector<RequestPtr> completed;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (dead_.load()) return false;
    queued_.fetch_add(frame.total(), std::memory_order_relaxed);
    queue_.push_back(std::move(frame));
    if (!want_write_) {
      flush_locked(&completed);
      if (!queue_.empty() && !dead_.load()) {
        want_write_ = true;
        loop_->want_write(fd_.get(), true);
      }
    }
  }
  for (auto& r : completed) r->part_done();
  return true;
}

void TcpStream::flush_locked(std::vector<RequestPtr>* completed) {
  while (!queue_.empty()) {
    iovec iov[kMaxIov];
    int n_iov = 0;
    for (auto it = queue_.begin(); it != queue_.end() && n_iov + 3 <= kMaxIov; ++it) {
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
      if (it->data_len > 0) add(it->data, it->data_len);
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n_iov);
    ssize_t n = sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
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
      if (left < rest) {
        f.sent += left;
        left = 0;
        break;
      }
      left -= rest;
      if (f.on_sent) completed->push_back(std::move(f.on_sent));
      queue_.pop_front();
    }
    // Zero-length frames never appear: every frame has a header.
  }
}

void TcpStream::on_writable() {
  std::vector<RequestPtr> completed;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    flush_locked(&completed);
    if (queue_.empty() && want_write_) {
      want_write_ = false;
      loop_->want_write(fd_.get(), false);
    }
  }
  for (auto& r : completed) r->part_done();
}

void TcpStream::on_error() { fail("socket error", 0); }

void TcpStream::fail(const std::string& why, int err_no) {
  if (auto conn = conn_.lock()) {
    std::string text = err_no != 0 ? errno_text(why + " on stream " + std::to_string(index_), err_no)
                                   : why + " on stream " + std::to_string(index_);
    conn->abort(ErrorKind::kConnection, "connection to " + conn->peer() + " lost: " + text);
  } else {
    kill();
  }
}

void TcpStream::kill() {
  if (dead_.exchange(true)) return;
  shutdown(fd_.get(), SHUT_RDWR);
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    queue_.clear();
    queued_.store(0);
  }
  loop_->post([self = shared_from_this()] {
    self->sink_ = RecvSink();
    self->loop_->remove(self->fd_.get());
  });
}

void TcpStream::on_readable() {
  uint64_t budget = kReadBudget;
  auto conn = conn_.lock();
  if (!conn) {
    kill();
    return;
  }
  while (!dead_.load() && budget > 0) {
    uint8_t* dst = nullptr;
    size_t want = 0;
    switch (phase_) {
      case Phase::kHeader:
        dst = header_buf_ + header_got_;
        want = FrameHeader::kSize - header_got_;
        break;
      case Phase::kMeta:
        dst = reinterpret_cast<uint8_t*>(meta_.data()) + meta_got_;
        want = meta_.size() - meta_got_;
        break;
      case Phase::kData: {
        const uint64_t left = header_.payload_len - data_got_;
        if (sink_.discard) {
          if (scratch_.empty()) scratch_.resize(kScratch);
          dst = scratch_.data();
          want = static_cast<size_t>(std::min<uint64_t>(left, scratch_.size()));
        } else {
          dst = (sink_.into_owned ? reinterpret_cast<uint8_t*>(sink_.owned.data()) : sink_.dst) +
                data_got_;
          want = static_cast<size_t>(std::min<uint64_t>(left, budget));
        }
        break;
      }
    }
    ssize_t n = recv(fd_.get(), dst, want, MSG_DONTWAIT);
    if (n == 0) {
      fail("peer closed the connection (EOF)", 0);
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      fail("recv", errno);
      return;
    }
    budget -= std::min<uint64_t>(budget, static_cast<uint64_t>(n));
    try {
      switch (phase_) {
        case Phase::kHeader:
          header_got_ += static_cast<size_t>(n);
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
          break;
        case Phase::kMeta:
          meta_got_ += static_cast<size_t>(n);
          if (meta_got_ == meta_.size()) start_payload();
          break;
        case Phase::kData:
          data_got_ += static_cast<uint64_t>(n);
          if (data_got_ == header_.payload_len) finish_frame();
          break;
      }
    } catch (const Error& e) {
      conn->abort(e.kind(), "connection to " + conn->peer() + " failed: " + e.what());
      return;
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
