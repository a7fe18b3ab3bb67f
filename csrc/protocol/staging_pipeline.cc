// The staging pipeline of one operation (staging.h): the ring of bounce slabs over which a
// staged write, read, send or receive overlaps its device copies with the wire, run on a
// Stager worker (Stager::run); and its cleanup after a failure, so that no copy and no wire
// operation still uses a slab it gives back.
#include <algorithm>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/error.h"
#include "protocol/staging.h"
#include "protocol/staging_op.h"
#include "transport/bounce_pool.h"

namespace rdmaxfer {

namespace {

constexpr double kCleanupWaitS = 5.0;    // bound on waits after a failure
constexpr double kMixedSliceS = 100e-6;  // poll slice while copies and wire ops overlap
constexpr double kSliceS = 20e-3;        // wait slice while only one kind is in flight

}  // namespace

// Runs one operation on a worker thread. Owns the lane and its slabs until the end; on failure
// it makes sure no copy and no wire operation still uses a slab before giving it back to the
// pool (else the pool strands it).
class Stager::Pipeline {
 public:
  Pipeline(Stager& stager, Op& op)
      : stager_(stager), op_(op), deadline_(op.options.timeout_s) {}
  ~Pipeline() { finish(); }
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  void execute() {
    try {
      switch (op_.kind) {
        case Op::Kind::kWrite: ring(true); break;
        case Op::Kind::kRead: ring(false); break;
        case Op::Kind::kSend: message_send(); break;
        case Op::Kind::kRecv: message_recv(); break;
      }
    } catch (const Error& e) {
      cleanup_after_failure(e);
      throw;
    }
  }

 private:
  enum class State { kFree, kCopying, kWire };
  struct Slot {
    State state = State::kFree;
    uint64_t chunk = 0;  // the chunk (write/read) or window offset (messages): age order
    RequestPtr req;
    WindowGrant window;  // messages sent or received in windows
  };

  BouncePool& pool() {
    if (pool_ == nullptr) pool_ = &stager_.transport_.domain().bounce_pool();
    return *pool_;
  }

  uint64_t chunk_bytes() {
    const uint64_t c = op_.options.chunk != 0 ? op_.options.chunk : StagingOptions::kDefaultChunk;
    return std::max<uint64_t>(1, std::min({c, op_.length, pool().slab_bytes()}));
  }

  // Takes `count` slabs from the pool, waiting within the operation's timeout.
  void take_slabs(int count, const std::string& what) {
    const Deadline deadline(op_.options.timeout_s);
    slabs_ = pool().acquire(count, deadline, [&] { check_stopped(what); });
  }

  [[noreturn]] void timed_out(const std::string& what) const {
    throw Error(ErrorKind::kTimeout, what + " made no progress for " +
                                         seconds_text(op_.options.timeout_s) + " s");
  }

  // `bytes` more of the operation are in place: tell its request (Transfer.wait bounds
  // inactivity), and push the pipeline's own deadline back (it bounds inactivity too).
  void progressed(uint64_t bytes) {
    op_.request->note_progress(bytes);
    deadline_ = Deadline(op_.options.timeout_s);
  }

  // Stops on the deadline, on Stager::close(), and (when `endpoint_matters`: bytes still
  // have to cross the wire) when the endpoint was closed or aborted.
  void check_deadline(const std::string& what, bool endpoint_matters = true) const {
    check_stopped(what, endpoint_matters);
    if (deadline_.expired()) timed_out(what);
  }

  void check_stopped(const std::string& what, bool endpoint_matters = true) const {
    if (stager_.closing_.load()) {
      throw Error(ErrorKind::kClosed, what + ": the engine was closed");
    }
    if (endpoint_matters && op_.conn->is_closed()) {
      const std::string why = op_.conn->error();
      throw Error(ErrorKind::kClosed,
                  what + ": the endpoint was closed" + (why.empty() ? "" : ": " + why));
    }
  }

  double slice(double cap) const {
    return std::min(cap, std::max(0.0, deadline_.remaining_ms() / 1000.0));
  }

  // One pipeline over `slots` bounce buffers: write = D2H then WRITE, read = READ then H2D.
  void ring(bool write) {
    const uint64_t c = chunk_bytes();
    const uint64_t n = op_.length == 0 ? 0 : (op_.length + c - 1) / c;
    if (n == 0) return;
    const int s = static_cast<int>(std::min<uint64_t>(
        {static_cast<uint64_t>(op_.options.slots), n, pool().max_slabs()}));
    auto len = [&](uint64_t chunk) { return std::min(c, op_.length - chunk * c); };
    const std::string what = std::string(write ? "staged write" : "staged read") + " of " +
                             std::to_string(op_.length) + " bytes";
    take_slabs(s, what);
    lane_ = stager_.copier_->open_lane(s);
    slots_.assign(static_cast<size_t>(s), Slot{});
    uint64_t next = 0;
    uint64_t finished = 0;
    while (finished < n) {
      bool progress = false;
      for (int k = 0; k < s; ++k) {
        Slot& x = slots_[static_cast<size_t>(k)];
        const BounceSlab& slab = *slabs_[static_cast<size_t>(k)];
        if (write) {
          if (x.state == State::kWire && x.req->done()) {
            x.req->rethrow();
            x.req.reset();
            x.state = State::kFree;
            ++finished;
            progressed(len(x.chunk));
            progress = true;
          }
          if (x.state == State::kCopying && lane_->ready(k)) {
            x.req = op_.conn->post_write(slab.region(), 0, op_.remote,
                                         op_.remote_offset + x.chunk * c, len(x.chunk),
                                         op_.options.wire);
            x.state = State::kWire;
            progress = true;
          }
          if (x.state == State::kFree && next < n) {
            copy_starts();
            lane_->to_host(k, slab.data(), op_.device + next * c, len(next));
            x.state = State::kCopying;
            x.chunk = next++;
            progress = true;
          }
        } else {
          if (x.state == State::kWire && x.req->done()) {
            x.req->rethrow();
            x.req.reset();
            copy_starts();
            lane_->to_device(k, op_.device + x.chunk * c, slab.data(), len(x.chunk));
            x.state = State::kCopying;
            progress = true;
          }
          if (x.state == State::kCopying && lane_->ready(k)) {
            x.state = State::kFree;
            ++finished;
            progressed(len(x.chunk));
            progress = true;
          }
          if (x.state == State::kFree && next < n) {
            x.req = op_.conn->post_read(slab.region(), 0, op_.remote,
                                        op_.remote_offset + next * c, len(next),
                                        op_.options.wire);
            x.state = State::kWire;
            x.chunk = next++;
            progress = true;
          }
        }
      }
      if (progress) continue;
      bool wire_pending = false;
      for (const Slot& x : slots_) wire_pending = wire_pending || x.state == State::kWire;
      check_deadline(what, write || wire_pending || next < n);
      wait_any(/*prefer_copy=*/write);
    }
  }

  // Blocks (one short slice) on the oldest copy or wire operation in flight.
  void wait_any(bool prefer_copy) {
    int copy = -1;
    int wire = -1;
    for (size_t k = 0; k < slots_.size(); ++k) {
      const Slot& x = slots_[k];
      if (x.state == State::kCopying &&
          (copy < 0 || x.chunk < slots_[static_cast<size_t>(copy)].chunk)) {
        copy = static_cast<int>(k);
      }
      if (x.state == State::kWire &&
          (wire < 0 || x.chunk < slots_[static_cast<size_t>(wire)].chunk)) {
        wire = static_cast<int>(k);
      }
    }
    const bool mixed = copy >= 0 && wire >= 0;
    const double t = slice(mixed ? kMixedSliceS : kSliceS);
    if (copy >= 0 && (prefer_copy || wire < 0)) {
      lane_->wait(copy, t);
    } else if (wire >= 0) {
      slots_[static_cast<size_t>(wire)].req->wait_for(t);
    }
  }

  void wait_request(const RequestPtr& req, const std::string& what) {
    uint64_t moved = req->moved_bytes();
    while (!req->wait_for(slice(kSliceS))) {
      const uint64_t now = req->moved_bytes();
      if (now > moved) progressed(now - moved);
      moved = now;
      check_deadline(what);
    }
    req->rethrow();
  }

  void wait_copy(int slot, const std::string& what, bool endpoint_matters) {
    while (!lane_->wait(slot, slice(kSliceS))) check_deadline(what, endpoint_matters);
  }

  // Takes `count` slabs for the receive of an announced message; if there are none in time,
  // the message is rejected too (its sender learns why instead of waiting for a CTS).
  void take_slabs_for_recv(int count, const std::string& what) {
    try {
      take_slabs(count, what);
    } catch (const Error& e) {
      try {
        op_.conn->reject(op_.msg_id, std::string("the receiver could not stage it: ") + e.what());
      } catch (const Error&) {
        // closed meanwhile: the sender learns that instead
      }
      throw;
    }
  }

  int window_slots(uint64_t window) {
    const uint64_t n = (op_.length + window - 1) / window;
    return static_cast<int>(std::min<uint64_t>(
        {static_cast<uint64_t>(op_.options.slots), n, pool().max_slabs()}));
  }

  // A staged message was announced when posted (Stager::post_send: so messages keep the
  // order they were posted in, staged or not) and moves in windows of at most a chunk: each
  // window the receiver grants is copied device-to-host into a free slab and written from
  // there, window k+1's copy overlapping window k's WRITE, through at most `slots` slabs
  // whatever the message's size. A message of one chunk or less is granted as one window.
  void message_send() {
    const std::string what = "staged send of " + std::to_string(op_.length) + " bytes";
    windows_ = op_.windows;
    if (op_.length == 0) {  // nothing to copy: done when the receiver answered
      wait_request(windows_->request(), what);
      return;
    }
    const uint64_t c = chunk_bytes();
    ++(op_.length > c ? stager_.messages_windowed_ : stager_.messages_whole_);
    const int s = window_slots(c);
    take_slabs(s, what);
    lane_ = stager_.copier_->open_lane(s);
    slots_.assign(static_cast<size_t>(s), Slot{});
    std::deque<WindowGrant> ready;  // granted, waiting for a free slab
    uint64_t sent = 0;
    while (sent < op_.length) {
      bool progress = false;
      while (std::optional<WindowGrant> w = windows_->take()) {
        ready.push_back(*w);
        progress = true;
      }
      for (int k = 0; k < s; ++k) {
        Slot& x = slots_[static_cast<size_t>(k)];
        const BounceSlab& slab = *slabs_[static_cast<size_t>(k)];
        if (x.state == State::kWire && x.req->done()) {
          x.req->rethrow();
          x.req.reset();
          x.state = State::kFree;
          sent += x.window.length;
          progressed(x.window.length);
          progress = true;
        }
        if (x.state == State::kCopying && lane_->ready(k)) {
          x.req = windows_->write(x.window, slab.region(), 0);
          x.state = State::kWire;
          progress = true;
        }
        if (x.state == State::kFree && !ready.empty()) {
          x.window = ready.front();
          ready.pop_front();
          x.chunk = x.window.offset;
          copy_starts();
          lane_->to_host(k, slab.data(), op_.device + x.window.offset, x.window.length);
          x.state = State::kCopying;
          progress = true;
        }
      }
      if (progress) continue;
      check_deadline(what);
      if (windows_->request()->done()) windows_->request()->rethrow();  // rejected, failed
      if (busy()) {
        wait_any(/*prefer_copy=*/true);
      } else {
        windows_->wait(slice(kSliceS));
      }
    }
    wait_request(windows_->request(), what);
  }

  // A message that fits one chunk (or came EAGER) lands whole in one slab; a longer one is
  // granted window by window into free slabs (recv_windows).
  void message_recv() {
    const std::string what = "staged recv of " + std::to_string(op_.length) + " bytes";
    const std::optional<Announcement> a = op_.conn->protocol().announcement(op_.msg_id);
    uint64_t w = chunk_bytes();
    if (a && a->window != 0) w = std::min(w, a->window);
    if (a && !a->eager && op_.length > w) {
      ++stager_.messages_windowed_;
      recv_windows(w, what);
      return;
    }
    ++stager_.messages_whole_;
    take_slabs_for_recv(1, what);
    BounceSlab& slab = *slabs_[0];
    lane_ = stager_.copier_->open_lane(1);
    slots_.assign(1, Slot{});
    slots_[0].state = State::kWire;
    slots_[0].req = op_.conn->post_recv(op_.msg_id, slab.region(), 0, op_.length);
    wait_request(slots_[0].req, what);
    slots_[0] = Slot{};
    lane_->to_device(0, op_.device, slab.data(), op_.length);
    wait_copy(0, what + " (host to device copy)", false);
  }

  // Each free slab is granted the next window; a landed window goes up by H2D while the next
  // ones land in the other slabs.
  void recv_windows(uint64_t w, const std::string& what) {
    const int s = window_slots(w);
    take_slabs_for_recv(s, what);
    lane_ = stager_.copier_->open_lane(s);
    slots_.assign(static_cast<size_t>(s), Slot{});
    MessageProtocol& protocol = op_.conn->protocol();
    recv_ = protocol.post_recv_windows(op_.msg_id, op_.length, w);
    uint64_t placed = 0;
    while (placed < op_.length) {
      bool progress = false;
      uint64_t copying = 0;
      for (int k = 0; k < s; ++k) {
        Slot& x = slots_[static_cast<size_t>(k)];
        const BounceSlab& slab = *slabs_[static_cast<size_t>(k)];
        if (x.state == State::kFree) {
          RequestPtr landed;
          if (protocol.grant_window(recv_, slab.region(), 0, &x.window, &landed)) {
            x.req = std::move(landed);
            x.chunk = x.window.offset;
            x.state = State::kWire;
            progress = true;
          }
        }
        if (x.state == State::kWire && x.req->done()) {
          x.req->rethrow();
          x.req.reset();
          copy_starts();
          lane_->to_device(k, op_.device + x.window.offset, slab.data(), x.window.length);
          x.state = State::kCopying;
          progress = true;
        }
        if (x.state == State::kCopying && lane_->ready(k)) {
          x.state = State::kFree;
          placed += x.window.length;
          progressed(x.window.length);
          progress = true;
        }
        if (x.state == State::kCopying) copying += x.window.length;
      }
      if (progress) continue;
      check_deadline(what, placed + copying < op_.length);  // bytes still to cross the wire
      wait_any(/*prefer_copy=*/false);
    }
    wait_request(recv_->request, what);
  }

  // Counts a copy that starts while other bytes of the operation are on the wire.
  void copy_starts() {
    for (const Slot& x : slots_) {
      if (x.state == State::kWire) {
        stager_.overlapped_copies_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
  }

  bool busy() const {
    for (const Slot& x : slots_) {
      if (x.state != State::kFree) return true;
    }
    return false;
  }

  // After a failure: let wire operations in flight end (abort the connection if they do not,
  // or at once after a timeout), so that nothing touches the bounce buffer afterwards.
  void cleanup_after_failure(const Error& e) {
    // In the middle of a windowed message the peer would wait for windows that never come.
    if ((windows_ && !windows_->request()->done()) || (recv_ && !recv_->request->done())) {
      op_.conn->abort(e.kind(), std::string("staging failed in the middle of a message: ") +
                                    e.what());
    }
    std::vector<RequestPtr> pending;
    for (const Slot& x : slots_) {
      if (x.state == State::kWire && x.req && !x.req->done()) pending.push_back(x.req);
    }
    if (pending.empty()) return;
    bool all_done = true;
    if (e.kind() != ErrorKind::kTimeout) {
      for (const RequestPtr& r : pending) all_done = r->wait_for(kCleanupWaitS) && all_done;
    } else {
      all_done = false;
    }
    if (!all_done) {
      op_.conn->abort(e.kind(), std::string("staging failed: ") + e.what());
      for (const RequestPtr& r : pending) r->wait_for(kCleanupWaitS);
    }
  }

  void finish() {
    lane_.reset();  // waits for copies still writing the slabs (or abandons a hung one)
    for (auto& slab : slabs_) {
      const bool unused = slab->region()->wait_unused(kCleanupWaitS);
      pool_->release(std::move(slab), !unused);
    }
    slabs_.clear();
  }

  Stager& stager_;
  Op& op_;
  Deadline deadline_;
  BouncePool* pool_ = nullptr;  // the domain's, which outlives every operation
  std::vector<std::unique_ptr<BounceSlab>> slabs_;
  std::unique_ptr<CopyLane> lane_;
  std::vector<Slot> slots_;
  std::shared_ptr<SendWindows> windows_;  // a windowed send's protocol side
  std::shared_ptr<RecvWindows> recv_;     // a windowed receive's protocol side
};

std::function<void()> Stager::run(Op& op) {
  const RequestPtr request = op.request;
  try {
    copier_->bind_thread();
    Pipeline pipeline(*this, op);
    pipeline.execute();
  } catch (const Error& e) {
    const ErrorKind kind = e.kind();
    std::string why = std::string("staging: ") + e.what();
    return [request, kind, why] { request->fail(kind, why); };
  } catch (const std::exception& e) {
    std::string why = std::string("staging: ") + e.what();
    return [request, why] { request->fail(ErrorKind::kTransport, why); };
  }
  return [request] { request->complete(); };
}

}  // namespace rdmaxfer
