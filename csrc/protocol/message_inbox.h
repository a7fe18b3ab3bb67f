// The receive side of two-sided messages, shared by every transport: messages the peer has
// announced (RTS or eager) but nobody received yet, and header waits (post_recv_header) in line
// for the next announcement; matched first come, first served.
//
// Not thread-safe: the owning connection's mutex guards it. Requests it hands back are completed
// or failed by the caller after unlocking.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/request.h"

namespace rdmaxfer {

struct AnnouncedMessage {
  uint64_t length = 0;
  bool eager = false;
  std::string data;  // an eager message's bytes
  uint64_t window = 0;  // RTS: the sender's window (protocol/message_windows.h; 0: none)
  uint32_t depth = 0;   // RTS: windows the sender fills at once
};

class MessageInbox {
 public:
  // Records message `info.msg_id`; throws Error(kProtocol) naming `peer` if that id was already
  // announced. Returns the longest-waiting header request, to be completed with `info`, or null
  // when none waits (the header is then queued for the next post_recv_header).
  RequestPtr announce(const std::string& peer, const MessageInfo& info, AnnouncedMessage message);
  // The next queued header, or nullopt after putting `waiter` in line.
  std::optional<MessageInfo> next_or_wait(const RequestPtr& waiter);
  // The longest-waiting header request, out of line (the message it would have matched was
  // refused: it is to be failed), or null when none waits.
  RequestPtr take_waiter();
  // Withdraws a header wait that has not matched yet; true when withdrawn.
  bool cancel(const RequestPtr& waiter);
  // Announced, not yet received messages by id (post_recv takes them out, reject drops them).
  std::unordered_map<uint64_t, AnnouncedMessage>& announced() { return announced_; }
  const std::unordered_map<uint64_t, AnnouncedMessage>& announced() const { return announced_; }
  // Forgets everything; returns the header requests still waiting (to be failed).
  std::vector<RequestPtr> clear();

 private:
  std::unordered_map<uint64_t, AnnouncedMessage> announced_;
  std::deque<MessageInfo> headers_;
  std::deque<RequestPtr> waiters_;
};

}  // namespace rdmaxfer
