// Notifications: a small payload a WRITE (or a batch of them) carries to the target, which
// learns it only once every byte of that request is in its memory (protocol/batch.h sends it
// as a NOTIFY control message after the last part of the request completed, on every lane).
//
// The engine keeps one NotificationQueue for all its connections; the protocol of each
// connection pushes into it, the application pops. Unbounded (a notification is a few dozen
// bytes; the application is expected to consume them). Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "common/unique_fd.h"
#include "transport/ctrl_message.h"

namespace rdmaxfer {

// What a notification carries: an int that fits an IMM (32 bits), or at most 64 bytes.
struct NotifyPayload {
  static constexpr size_t kMaxBytes = 64;
  bool is_int = false;
  uint32_t value = 0;  // is_int
  std::string bytes;   // !is_int

  // The NOTIFY control message (transport/ctrl_message.h) of request `request_id`.
  CtrlMessage message(uint64_t request_id) const;
  // The payload of a received NOTIFY; throws Error(kProtocol) when it is malformed.
  static NotifyPayload of(const CtrlMessage& message);
};

struct Notification {
  std::string peer;  // host:port of the connection it came on
  NotifyPayload payload;
};

class NotificationQueue {
 public:
  NotificationQueue();
  // Readable (eventfd) while a notification waits; for event loops.
  int fd() const { return fd_.get(); }
  void push(Notification notification);
  // The oldest notification, or nullopt when none arrives within `timeout_s` (0: look once).
  std::optional<Notification> pop(double timeout_s);
  // Wakes every waiter of pop (engine close); later pops do not block.
  void close();

 private:
  void clear_fd_locked();

  UniqueFd fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Notification> queue_;
  bool closed_ = false;
};

}  // namespace rdmaxfer
