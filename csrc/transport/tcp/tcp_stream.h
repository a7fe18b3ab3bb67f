// One TCP stream of a connection: a send queue of frames and a receive state machine.
//
// Lifecycle: created by TcpConnection with a connected socket -> added to an IoLoop -> frames
// flow both ways -> kill() (on close or error): the socket is shut down, the send queue is
// dropped (the requests of the dropped frames are handed back to be failed), and the loop
// removes and frees the stream; any memory it was reading into or sending
// from is released (RegionUse) only then.
//
// Sending: any thread may enqueue; when the queue was empty the caller writes inline, and the
// loop finishes what the socket could not take (EPOLLOUT). Receiving: header -> metadata ->
// data straight into the destination the connection chose, on the loop thread, or on a thread
// that waits for a request of this stream (drive(): it borrows the stream from the loop, which
// then neither watches nor reads it, and polls the socket itself; one less thread hand-off per
// completion, like a plain blocking socket). recv_mu_ serializes the two.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/unique_fd.h"
#include "core/region.h"
#include "core/request.h"
#include "core/stats.h"
#include "transport/tcp/io_loop.h"
#include "transport/tls.h"
#include "transport/wire.h"

namespace rdmaxfer {

class TcpConnection;

struct OutFrame {
  uint8_t header[FrameHeader::kSize];
  std::string meta;
  const uint8_t* data = nullptr;
  uint64_t data_len = 0;
  // Instead of `data`: the pieces of a WRITE_GATHER, sent one after another (data_len bytes).
  std::vector<std::pair<const uint8_t*, uint64_t>> gather;
  uint64_t sent = 0;       // bytes of header + meta + data already written
  RegionUse hold;          // keeps the memory behind `data` in use
  std::vector<RegionUse> holds;  // and that behind `gather`, when it spans regions
  RequestPtr on_sent;      // part_done() once the whole frame is in the socket
  RequestPtr progress;     // note_progress() as the data goes into the socket (bytes
                           // counted only with on_sent; else the time alone)
  uint64_t total() const { return FrameHeader::kSize + meta.size() + data_len; }
  // Bytes of `data` (not header or metadata) already written.
  uint64_t data_sent() const {
    const uint64_t before = FrameHeader::kSize + meta.size();
    return sent > before ? sent - before : 0;
  }
};

OutFrame make_frame(const FrameHeader& header, std::string meta = {});

// Where the data of an incoming frame goes.
struct RecvSink {
  uint8_t* dst = nullptr;  // straight into registered memory, or
  // into these pieces one after another (a WRITE_GATHER; null: a refused piece, discarded),
  std::vector<std::pair<uint8_t*, uint64_t>> scatter;
  size_t scatter_at = 0;       // the piece the next byte goes to
  uint64_t scatter_off = 0;    // and where in it
  std::vector<RegionUse> holds;  // the scatter pieces' regions
  std::string statuses;          // one AccessStatus byte per scatter piece
  std::string owned;       // into a buffer the connection keeps (small messages), or
  bool discard = false;    // nowhere (a refused WRITE's bytes)
  bool into_owned = false;
  RegionUse hold;
  RequestPtr progress;  // note_progress() as the bytes land
  uint32_t status = 0;  // AccessStatus decided when the header arrived
};

// While a thread holds a Cork, the small frames it enqueues wait in their streams' queues; the
// Cork writes each such stream once when it ends: one sendmsg for many frames (the WRITEs a
// batch posts as acknowledgements come in, the acknowledgements of one read from the socket).
// A Cork made while another is held on the thread leaves the writing to the outer one.
class Cork {
 public:
  Cork();
  ~Cork();
  Cork(const Cork&) = delete;
  Cork& operator=(const Cork&) = delete;

 private:
  bool owner_ = false;
};

class TcpStream : public IoHandler, public Progress, public std::enable_shared_from_this<TcpStream> {
 public:
  // `stats`: the connection's counters; the stream counts the data it sends (lane = its
  // index) and every time the socket refuses more bytes (a credit stall).
  // `tls`: the stream's TLS session (every byte goes through it), or null for plain TCP.
  TcpStream(UniqueFd fd, std::unique_ptr<TlsSession> tls, int index, IoLoop* loop,
            std::weak_ptr<TcpConnection> conn, std::shared_ptr<Stats> stats);
  int fd() const override { return fd_.get(); }
  int index() const { return index_; }
  IoLoop* loop() const { return loop_; }

  // Any thread. Returns false (and drops the frame) when the stream is dead.
  bool enqueue(OutFrame frame);
  uint64_t queued_bytes() const { return queued_.load(std::memory_order_relaxed); }

  // Shuts the socket down and schedules removal from the loop. Idempotent, any thread.
  // Returns the requests of the frames it dropped from the send queue (on_sent): the caller
  // fails them, since no table may hold them (a rendezvous send's data chunks).
  [[nodiscard]] std::vector<RequestPtr> kill();

  void on_readable() override;
  void on_writable() override;
  void on_error() override;

  // Progress (core/request.h), for a request whose completion arrives on this stream. A
  // waiting thread drives the stream (borrowed from the loop) until the request is terminal or
  // the time is up: it polls the socket without blocking for the loop's wait budget (the poll
  // mode's, core/poll_mode.h), then sleeps in poll(); it returns the time left only when the
  // stream died first. waited() tunes that budget.
  double drive(const std::atomic<bool>& terminal, double timeout_s) override;
  void waited(int64_t waited_ns) override { loop_->wait_budget().record(waited_ns); }
  // Nothing to poll without blocking: waits drive(), and a dead stream has nothing to do.
  bool progress() override { return false; }

 private:
  friend class Cork;
  void flush_locked(std::vector<RequestPtr>* completed);
  // Writes what waited for a Cork (unless the loop already writes this stream's backlog).
  void uncork();
  // What the loop watches: nothing while borrowed, else readable (+ writable with a backlog).
  void update_watch_locked();
  // Writes what the socket takes (send_mu_ taken here); completes the frames' requests.
  void flush();
  // Reads what the socket has and feeds the frames on (takes recv_mu_).
  void receive();
  // Feeds bytes from the staging buffer into the receive state machine; returns bytes used.
  size_t consume(const uint8_t* p, size_t n);
  // The iovecs (at most kScatterIov, `budget` bytes) that read the rest of a WRITE_GATHER's
  // data straight into its pieces.
  size_t scatter_iov(iovec* iov, uint64_t budget);
  // Moves past n bytes of a WRITE_GATHER's data, copying them from `p` into the pieces
  // (skipping refused ones) unless p is null (they were read in place).
  void scatter(const uint8_t* p, size_t n);
  void start_payload();
  void finish_frame();
  void fail(const std::string& why, int err_no);
  // kill() on the stream's own account, failing the dropped frames' requests with `why`.
  void retire(const std::string& why);

  UniqueFd fd_;
  const std::unique_ptr<TlsSession> tls_;
  const int index_;
  IoLoop* const loop_;
  std::weak_ptr<TcpConnection> conn_;
  const std::shared_ptr<Stats> stats_;
  std::atomic<bool> dead_{false};

  std::mutex send_mu_;
  std::deque<OutFrame> queue_;
  bool want_write_ = false;
  bool blocked_ = false;  // the socket refused bytes (EAGAIN) and the queue has not emptied
  std::atomic<uint64_t> queued_{0};
  int watching_ = 1;                   // what the loop watches: 1 read, 2 write (send_mu_)
  int borrowers_ = 0;                  // threads in drive() (send_mu_)
  std::atomic<bool> borrowed_{false};  // borrowers_ > 0, read by the loop without the lock
  bool removed_ = false;               // out of the loop; the last borrower closes fd_ (send_mu_)

  std::mutex recv_mu_;  // the receive state below

  enum class Phase { kHeader, kMeta, kData };
  Phase phase_ = Phase::kHeader;
  uint8_t header_buf_[FrameHeader::kSize];
  size_t header_got_ = 0;
  FrameHeader header_;
  std::string meta_;
  size_t meta_got_ = 0;
  RecvSink sink_;
  uint64_t data_got_ = 0;
  std::vector<uint8_t> stage_;  // bytes read ahead from the socket
  size_t stage_pos_ = 0;
  size_t stage_len_ = 0;
};

}  // namespace rdmaxfer
