#include "protocol/notifications.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>

#include "common/error.h"

namespace rdmaxfer {

CtrlMessage NotifyPayload::message(uint64_t request_id) const {
  CtrlMessage m;
  m.type = CtrlType::kNotify;
  m.msg_id = request_id;
  m.size = is_int ? 1 : 0;
  m.key = is_int ? value : 0;
  if (!is_int) m.meta = bytes;
  return m;
}

NotifyPayload NotifyPayload::of(const CtrlMessage& message) {
  NotifyPayload p;
  if (message.size > 1) {
    throw Error(ErrorKind::kProtocol,
                "NOTIFY with unknown payload kind " + std::to_string(message.size));
  }
  p.is_int = message.size == 1;
  if (p.is_int) {
    if (!message.meta.empty()) throw Error(ErrorKind::kProtocol, "NOTIFY int with bytes");
    p.value = message.key;
  } else {
    if (message.meta.size() > kMaxBytes) {
      throw Error(ErrorKind::kProtocol, "NOTIFY payload of " +
                                            std::to_string(message.meta.size()) +
                                            " bytes exceeds " + std::to_string(kMaxBytes));
    }
    p.bytes = message.meta;
  }
  return p;
}

NotificationQueue::NotificationQueue() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!fd_.valid()) throw_errno("eventfd for notifications");
}

void NotificationQueue::push(Notification notification) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(notification));
    const uint64_t one = 1;
    // A full counter (EAGAIN) still leaves the fd readable, which is all a reader needs.
    const ssize_t n = write(fd_.get(), &one, sizeof(one));
    (void)n;
  }
  cv_.notify_all();
}

void NotificationQueue::clear_fd_locked() {
  uint64_t count = 0;
  const ssize_t n = read(fd_.get(), &count, sizeof(count));  // EAGAIN: already clear
  (void)n;
}

std::optional<Notification> NotificationQueue::pop(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  while (queue_.empty() && !closed_) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) break;
  }
  if (queue_.empty()) return std::nullopt;
  Notification out = std::move(queue_.front());
  queue_.pop_front();
  if (queue_.empty()) clear_fd_locked();
  return out;
}

void NotificationQueue::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

}  // namespace rdmaxfer
