// One posted operation (WRITE, READ, SEND, RECV, or the wait for an incoming message header).
//
// Lifecycle: pending (posted; `parts` outstanding) -> done | failed. The first terminal state
// wins and never changes. I/O threads complete or fail a request; any thread may wait on it with
// a timeout. A request watched by a Notifier reports its id there once it is terminal.
// A request may carry a Progress (set once, before it is handed out): a waiting thread then
// drives completion processing itself during the spin phase of wait_for.
// Progress is also recorded: every finished part and every batch of bytes a transport moves for
// the request (note_progress) stamps the time, so a waiter can bound inactivity (no progress
// for N seconds) rather than the whole transfer. A request that is one operation of a larger
// one (a batch's) forwards its progress to that one as it is noted (forward_progress), so the
// larger one's inactivity bound sees bytes as they move, not only as its operations end.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/error.h"

namespace rdmaxfer {

class Notifier;

// Caller-driven progress: a transport whose completions normally reach requests through a
// background thread lets a thread that waits anyway do that work itself (verbs: poll the CQ).
// progress() looks once without blocking, dispatches what it found, and returns true when it
// processed anything. It must be safe from any thread, concurrently with the background thread,
// and must not block on locks that completion handlers hold (implementations use a try-lock).
//
// A transport that owns the socket a request's completion arrives on can do better than a spin:
// drive() makes the waiting thread the I/O thread for that socket until the request is terminal
// or the time is up (it blocks in poll(2), so the kernel wakes the waiter itself when the
// completion arrives, not a background thread that then wakes the waiter).
class Progress {
 public:
  virtual ~Progress() = default;
  virtual bool progress() = 0;
  // Blocks up to `timeout_s` processing I/O on the calling thread until `terminal` is set.
  // Returns the seconds of the wait it did not cover (0 when it covered it all): where it cannot
  // drive (the default: at once; a stream that died meanwhile: the rest), the caller waits that
  // long the usual way.
  virtual double drive(const std::atomic<bool>& terminal, double timeout_s) {
    (void)terminal;
    return timeout_s;
  }
  // A wait on a request this Progress serves (one wait_for call) ended after `waited_ns`, the
  // request terminal or not: a transport that tunes its spin by the waits it sees
  // (core/poll_mode.h) learns from it here. Default: nothing.
  virtual void waited(int64_t waited_ns) { (void)waited_ns; }
};

enum class OpKind { kWrite, kRead, kSend, kRecv, kRecvHeader };
const char* op_kind_name(OpKind op);

// What a RECV header wait yields: the sender's message id, size in bytes and metadata.
struct MessageInfo {
  uint64_t msg_id = 0;
  uint64_t length = 0;
  std::string meta;
};

class Request {
 public:
  enum class State { kPending, kDone, kFailed };

  Request(uint64_t id, OpKind op, uint64_t bytes);
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  uint64_t id() const { return id_; }
  OpKind op() const { return op_; }
  uint64_t bytes() const { return bytes_; }
  State state() const;
  bool done() const { return state() != State::kPending; }

  // Number of parts (chunks, acknowledgements) that must finish before the request is done.
  void set_parts(uint64_t parts);
  void part_done();
  // One more part (a part done again): false, and nothing changes, once every part finished
  // (the request is complete, or completes on another thread now). Any thread.
  bool add_part();
  uint64_t parts_left() const { return parts_left_.load(); }
  // `bytes` more of the request moved (sent into a socket, placed in memory); any thread.
  // 0 records activity alone (bytes that count only once acknowledged, as parts).
  void note_progress(uint64_t bytes);
  // Seconds since the request last made progress (or was created).
  double idle_s() const;
  // From now on every note_progress and finished part here is also noted on `parent` (its
  // bytes, or activity alone); bytes noted before this call are not. Any thread.
  void forward_progress(std::shared_ptr<Request> parent);
  // Bytes of this request that were noted on the parent so far.
  uint64_t forwarded_bytes() const;
  // Bytes moved so far: those noted, or (for transports that only count parts) the share of
  // finished parts.
  uint64_t moved_bytes() const;
  void complete();
  void complete_with_message(MessageInfo info);
  void fail(ErrorKind kind, const std::string& message);
  // Fails with `cause`'s kind and message, keeping its errno and completion status.
  void fail(const Error& cause);

  // Blocks until terminal or the timeout; true when terminal. A Progress that can drive()
  // (TCP: the request's stream) is driven by the waiting thread for the whole wait. Otherwise
  // it spins for up to `spin_us` microseconds first (plus a few dozen polls), so a short
  // transfer completes without a futex wake-up: with a Progress the spin polls it (caller-driven
  // progress, no syscall per turn), without one it yields the CPU (sched_yield) each turn. The
  // bound is the caller's; after it the thread sleeps on a condition variable and the
  // transport's background thread completes the request.
  bool wait_for(double timeout_s, int spin_us = 0) const;
  // Set by the transport right after construction, before the request is shared. Held weakly:
  // a request that outlives its transport just stops driving it.
  void set_progress(std::weak_ptr<Progress> progress) { progress_ = std::move(progress); }
  // Throws the stored Error when failed; no-op otherwise.
  void rethrow() const;
  MessageInfo message() const;
  std::string error_message() const;
  // The kind of the stored error (meaningful once failed).
  ErrorKind error_kind() const;

  void watch(const std::shared_ptr<Notifier>& notifier);
  // Called once, on the thread that makes the request terminal, right after (the protocol
  // passes a message's credit on there). Set before the request is handed out.
  void set_on_terminal(std::function<void(const Request&)> fn) { on_terminal_ = std::move(fn); }
  // Runs `fn` once the request is terminal, after the on_terminal set before (a batch follows
  // its parts with it): on the thread that makes it terminal, or at once, here, when it already
  // is. Any thread, any time.
  void then(std::function<void(const Request&)> fn);

 private:
  void finish_locked(State state, std::unique_lock<std::mutex>& lock);
  void forward(uint64_t bytes);
  // wait_for's work, driving or polling `progress` when there is one.
  bool wait_with(Progress* progress, double timeout_s, int spin_us) const;

  const uint64_t id_;
  const OpKind op_;
  const uint64_t bytes_;
  std::atomic<uint64_t> parts_total_{1};
  std::atomic<uint64_t> parts_left_{1};
  std::atomic<uint64_t> moved_{0};
  std::atomic<int64_t> last_progress_ns_;  // steady_clock, since its epoch
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  State state_ = State::kPending;
  std::atomic<bool> terminal_{false};  // mirrors state_ != kPending, for lock-free spinning
  ErrorKind error_kind_ = ErrorKind::kTransport;
  std::string error_;
  int error_errno_ = 0;
  CompletionStatus error_completion_;
  MessageInfo message_;
  std::shared_ptr<Notifier> notifier_;
  std::weak_ptr<Progress> progress_;
  std::function<void(const Request&)> on_terminal_;
  std::atomic<bool> forwards_{false};  // parent_ is set: take forward_mu_ and note there
  mutable std::mutex forward_mu_;
  std::shared_ptr<Request> parent_;  // guarded by forward_mu_, as forwarded_
  uint64_t forwarded_ = 0;
};

using RequestPtr = std::shared_ptr<Request>;

}  // namespace rdmaxfer
