// A point in time that a bounded wait must not pass. Built from a timeout in seconds.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

namespace rdmaxfer {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  // timeout_s < 0 or infinite means "no deadline" (only used internally; the Python API always
  // passes a finite timeout).
  explicit Deadline(double timeout_s) : timeout_s_(timeout_s) {
    if (timeout_s < 0 || std::isinf(timeout_s)) {
      at_ = Clock::time_point::max();
    } else {
      at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(timeout_s));
    }
  }

  Clock::time_point at() const { return at_; }
  // The timeout this deadline was built from, in seconds (for messages).
  double timeout_s() const { return timeout_s_; }
  bool expired() const { return Clock::now() >= at_; }

  // Milliseconds left, rounded up and clamped to [0, cap_ms]; for poll()/epoll_wait(). Rounded
  // up, so that a wait of that many milliseconds reaches the deadline (rounded down, the last
  // fraction of a millisecond would be spun through in waits of 0 ms).
  int remaining_ms(int cap_ms = std::numeric_limits<int>::max()) const {
    if (at_ == Clock::time_point::max()) return cap_ms;
    auto left = std::chrono::ceil<std::chrono::milliseconds>(at_ - Clock::now()).count();
    if (left < 0) return 0;
    return left > cap_ms ? cap_ms : static_cast<int>(left);
  }

 private:
  double timeout_s_;
  Clock::time_point at_;
};

// Now on the steady clock, in nanoseconds (for a time kept in an atomic).
inline int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Deadline::Clock::now().time_since_epoch())
      .count();
}

// Seconds for a message: "0.25", "5", "60", "1.5e+03" (printf %.3g).
inline std::string seconds_text(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", seconds);
  return buf;
}

}  // namespace rdmaxfer
