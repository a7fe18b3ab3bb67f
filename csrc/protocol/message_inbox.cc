#include "protocol/message_inbox.h"

#include "common/error.h"

namespace rdmaxfer {

RequestPtr MessageInbox::announce(const std::string& peer, const MessageInfo& info,
                                  AnnouncedMessage message) {
  if (!announced_.emplace(info.msg_id, std::move(message)).second) {
    throw Error(ErrorKind::kProtocol,
                "peer " + peer + " announced message " + std::to_string(info.msg_id) + " twice");
  }
  if (waiters_.empty()) {
    headers_.push_back(info);
    return nullptr;
  }
  RequestPtr waiter = std::move(waiters_.front());
  waiters_.pop_front();
  return waiter;
}

std::optional<MessageInfo> MessageInbox::next_or_wait(const RequestPtr& waiter) {
  if (headers_.empty()) {
    waiters_.push_back(waiter);
    return std::nullopt;
  }
  MessageInfo info = std::move(headers_.front());
  headers_.pop_front();
  return info;
}

RequestPtr MessageInbox::take_waiter() {
  if (waiters_.empty()) return nullptr;
  RequestPtr waiter = std::move(waiters_.front());
  waiters_.pop_front();
  return waiter;
}

bool MessageInbox::cancel(const RequestPtr& waiter) {
  for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
    if (*it == waiter) {
      waiters_.erase(it);
      return true;
    }
  }
  return false;
}

std::vector<RequestPtr> MessageInbox::clear() {
  std::vector<RequestPtr> waiting(waiters_.begin(), waiters_.end());
  waiters_.clear();
  headers_.clear();
  announced_.clear();
  return waiting;
}

}  // namespace rdmaxfer
