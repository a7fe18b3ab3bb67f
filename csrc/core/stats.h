// Counters of one connection (or of a whole engine): operations and bytes per kind, bytes per
// lane, errors, retries and credit stalls. Every counter is a relaxed atomic: any thread adds,
// any thread reads a snapshot, nothing allocates on the counting path.
//
// A Stats may have a parent (the engine's): every count also goes to the parent, so the
// engine's counters are the sum of its live and closed connections plus what happened before a
// connection existed (a failed connect, its retries).
//
// Operation kinds: "write", "read", "send", "recv", "ctrl" (control messages).
// Error kinds: the operation kinds plus "connect", "accept" (a set-up that failed) and
// "connection" (a connection that ended on an error rather than by a local close).
// Lanes: 0 .. kMaxLanes - 1 (TCP streams, verbs QPs; a connection has at most 128); a lane
// outside that range counts in the totals only.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace rdmaxfer {

class Request;

class Stats {
 public:
  static constexpr int kMaxLanes = 128;

  explicit Stats(std::shared_ptr<Stats> parent = nullptr) : parent_(std::move(parent)) {}
  Stats(const Stats&) = delete;
  Stats& operator=(const Stats&) = delete;

  // One completed operation of `kind` that moved `bytes`, all on `lane`.
  void add(const std::string& kind, int lane, uint64_t bytes);
  // One completed operation whose bytes were counted per lane (add_lane) as its parts finished.
  void add_op(const std::string& kind, uint64_t bytes);
  // One finished part (chunk, WR) of an operation: `bytes` of payload carried by `lane`.
  void add_lane(int lane, uint64_t bytes);
  void add_error(const std::string& kind);
  // A connect attempt that was refused and tried again.
  void add_retry();
  // A sender began to wait: for a credit (verbs window) or for room in the socket (TCP).
  void add_credit_stall();
  // An I/O thread (TCP loop, shm reader) spent `ns` polling for its next event instead of
  // sleeping (its poll mode's linger: core/poll_mode.h).
  void add_linger_ns(uint64_t ns);

  // Every counter by name: "<kind>.ops", "<kind>.bytes", "errors.<kind>", "retries",
  // "credit_stalls", and "lane<N>.bytes" / "lane<N>.chunks" for lanes 0 .. the highest used;
  // an engine's (a Stats without parent) also "io_linger_us", its I/O threads' linger in µs.
  std::vector<std::pair<std::string, uint64_t>> snapshot() const;

 private:
  static constexpr int kOpKinds = 5;
  static constexpr int kErrorKinds = kOpKinds + 3;
  struct Lane {
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> chunks{0};
  };

  std::shared_ptr<Stats> parent_;
  std::array<std::atomic<uint64_t>, kOpKinds> ops_{};
  std::array<std::atomic<uint64_t>, kOpKinds> bytes_{};
  std::array<std::atomic<uint64_t>, kErrorKinds> errors_{};
  std::atomic<uint64_t> retries_{0};
  std::atomic<uint64_t> credit_stalls_{0};
  std::atomic<uint64_t> linger_ns_{0};
  std::atomic<int> lanes_used_{0};
  std::array<Lane, kMaxLanes> lanes_{};
};

// Counts a terminal `request` into `stats`: done, as one operation of `kind` with its bytes;
// failed, as an error of `kind` (a failure of the caller's own making, kClosed, is not counted).
// A failure that leaves the connection open is logged at WARNING (one that ends with the
// connection is logged once, by the channel, with its cause; here at DEBUG).
void count_terminal(Stats& stats, const Request& request, const char* kind);

}  // namespace rdmaxfer
