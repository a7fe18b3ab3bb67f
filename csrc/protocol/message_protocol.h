// The two-sided protocol, once for every transport (UCX's UCP level over a Channel's
// primitives, transport/channel.h): messages of `length` bytes with opaque metadata (dtype,
// shape...), eager or rendezvous, flow-controlled by credits.
//
//   sender                                   receiver
//   post_send: EAGER (data in the control    on_ctrl: the header is announced (MessageInbox);
//     message) if it fits the channel's        post_recv_header hands it out
//     eager limit and control room, else     post_recv: EAGER -> copy, CTS;
//     RTS (size + meta)                        rendezvous -> grant the destination, CTS with
//   CTS: EAGER -> done; rendezvous ->           the grant's addr + key + route
//     post_write_notify into the grant       on_notify(value): the bytes are in place, the
//     (chunked, striped by the channel),       grant is released, the RECV completes
//     done when the bytes left
//   REJECT: the send fails (kProtocol)       reject: REJECT with the reason
//   a granted send that fails while the      on_ctrl: ABORT -> the RECV fails at once (its
//     channel stays open (a rail failed        grants released), not at its timeout
//     under its WRITE): ABORT with the error
//   (batch.h) NOTIFY after a request's       on_ctrl: NOTIFY -> the engine's notification
//     bytes were placed                        queue, with the peer's address
//
// A message may also move in windows, each its own grant and notified WRITE, when either end
// cannot take it in one range (message_windows.h: the staging pipeline's GPU messages).
//
// Credits: at most `credit_window` messages (ChannelLimits; 0 = no limit) are announced and not
// yet terminal at the sender; later sends wait here, in order, as headers only. A message
// holds its credit until its send is terminal (CTS of an EAGER, its data written, REJECT,
// failure). When the channel closes (on_closed) every pending request fails with its reason.
//
// Counting points (for the stats of every connection): finished() for a SEND or RECV that
// is terminal (done or failed), credit_stall() when a send starts waiting for credit,
// protocol_error() where a protocol error is raised (the channel then closes).
//
// Thread safety: one mutex guards the tables; channel calls and request completions happen
// outside it. Lock order: this mutex before the channel's.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "protocol/message_inbox.h"
#include "protocol/message_windows.h"
#include "protocol/notifications.h"
#include "transport/channel.h"

namespace rdmaxfer {

class MessageProtocol : public ChannelEvents,
                        public std::enable_shared_from_this<MessageProtocol> {
 public:
  // NOTIFY messages from the peer go to `notifications` (the engine's; null: dropped). A
  // message the peer announces beyond `max_message_bytes` (0: no bound) is refused at once
  // (REJECT naming the bound; the sender's request fails with kProtocol): no receive sees it,
  // nothing is allocated for it.
  explicit MessageProtocol(std::shared_ptr<NotificationQueue> notifications = nullptr,
                           uint64_t max_message_bytes = 0)
      : notifications_(std::move(notifications)), max_message_bytes_(max_message_bytes) {}
  // Bound to its channel once the channel exists (held weakly: the channel owns the protocol).
  void bind(const std::shared_ptr<Channel>& channel) { channel_ = channel; }

  // `eager`: false keeps the bytes out of control messages (device memory the CPU cannot read).
  RequestPtr post_send(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                       uint64_t length, const std::string& meta, const TransferOptions& options,
                       bool eager = true);
  RequestPtr post_recv_header();
  RequestPtr post_recv(uint64_t msg_id, const std::shared_ptr<MemoryRegion>& local,
                       uint64_t offset, uint64_t length);
  void reject(uint64_t msg_id, const std::string& reason);
  // Withdraws a header wait that has not matched a message yet; true when withdrawn.
  bool cancel_recv_header(const RequestPtr& request);
  // Windowed rendezvous (message_windows.h). A message whose bytes the caller supplies window
  // by window, WRITEs of at most `window` bytes, `depth` of them at once (RTS sent now or when
  // a credit frees).
  std::shared_ptr<SendWindows> post_send_windows(uint64_t length, const std::string& meta,
                                                 uint64_t window, uint32_t depth,
                                                 const TransferOptions& options);
  // The announced message `msg_id`, if it still waits to be received.
  std::optional<Announcement> announcement(uint64_t msg_id) const;
  // Takes the announced rendezvous message `msg_id` of `length` bytes to be received in windows
  // of `window` bytes, which the caller grants (grant_window).
  std::shared_ptr<RecvWindows> post_recv_windows(uint64_t msg_id, uint64_t length,
                                                 uint64_t window);
  // Grants the next window of `recv` into region[offset:]; false when every window was granted.
  // `landed` is done once the window's bytes are in place.
  bool grant_window(const std::shared_ptr<RecvWindows>& recv,
                    const std::shared_ptr<MemoryRegion>& region, uint64_t offset,
                    WindowGrant* window, RequestPtr* landed);

  // credit_window, sends_waiting_for_credit, messages_waiting_for_recv (with a window only).
  std::vector<std::pair<std::string, uint64_t>> attributes() const;

  void on_ctrl(CtrlMessage message) override;
  void on_notify(uint32_t value) override;
  void on_closed(const Error& why) override;

 private:
  struct PendingSend {
    RequestPtr request;
    std::shared_ptr<MemoryRegion> region;
    uint64_t offset = 0;
    uint64_t length = 0;
    TransferOptions options;
    bool eager = false;
    bool credited = false;  // holds a credit (announced)
    std::string meta;       // until announced
    uint64_t window = 0;    // RTS: the most bytes one WRITE may carry (0: any)
    uint32_t depth = 0;     // RTS: windows written at once
    uint64_t granted = 0;   // bytes the receiver granted in windows from offset 0 on
    // Windows granted beyond `granted` (offset -> bytes): a receiver granting from two threads
    // may send its CTS messages out of order; each is checked against these, never overlapping.
    std::map<uint64_t, uint64_t> granted_ahead;
    std::shared_ptr<SendWindows> windows;  // set by the first windowed CTS (or at post)
  };
  struct PendingRecv {
    RequestPtr request;
    uint64_t grant = 0;
  };

  std::shared_ptr<Channel> channel() const;
  void check_open_locked(const Channel& channel) const;
  // The announced message `msg_id`, checked open and `length` bytes long, for a RECV (mu_ held).
  AnnouncedMessage& announced_locked(const Channel& channel, uint64_t msg_id, uint64_t length);
  void check_meta(const std::string& meta, const ChannelLimits& limits) const;
  // Takes a credit for `send` (or queues it for one) and announces it when it has one.
  void enqueue(const Channel& channel, PendingSend send);
  // Sends the RTS or EAGER of a message that holds a credit.
  void announce(uint64_t msg_id);
  // A send is terminal: its credit goes to the next waiting message, if any.
  void release_credit(uint64_t msg_id);
  // Checks a CTS window of `length` bytes at `offset` against what `s` was granted so far and
  // records it (mu_ held): false when it overlaps a granted one, runs past the message or its
  // window size, or more than kMaxGrantsOutOfOrder windows wait beyond the first gap.
  static bool new_window(PendingSend& s, uint64_t offset, uint64_t length);
  static constexpr size_t kMaxGrantsOutOfOrder = 1024;
  void on_answer(const CtrlMessage& message);
  // Windowed rendezvous (message_windows.cc).
  void on_window(const CtrlMessage& message);
  // A free notification value: `preferred` unless taken (by a receive in flight).
  uint32_t pick_value_locked(uint32_t preferred);
  std::shared_ptr<RecvWindows> start_windows_locked(uint64_t msg_id, const RequestPtr& request,
                                                    uint64_t length, uint64_t window);
  // Grants windows of a receive into its destination until `ahead` are in flight.
  void refill(const std::shared_ptr<RecvWindows>& recv);
  // A window of a windowed receive landed (on_notify); false when `value` names none.
  bool window_landed(uint32_t value);
  void forget_send(uint64_t msg_id);
  // A send is terminal: when it failed after the peer granted it and the channel is open, the
  // peer is told (ABORT), so its RECV fails now rather than at its timeout.
  void abort_if_granted(const Request& done);
  // The peer gave up on its message `msg_id` (ABORT, `reason` its error): the RECV of it, whole
  // or windowed, fails and its grants go.
  void on_abort(uint64_t msg_id, const std::string& reason);
  // The counting points (see the header comment).
  void finished(const Request& request);
  void credit_stall(uint64_t msg_id);
  [[noreturn]] void protocol_error(const std::string& what);

  // Answers an announcement beyond max_message_bytes_ with a REJECT (on_ctrl).
  void refuse_oversize(const CtrlMessage& message);

  std::shared_ptr<NotificationQueue> notifications_;
  const uint64_t max_message_bytes_;
  std::weak_ptr<Channel> channel_;
  mutable std::mutex mu_;
  bool closed_ = false;
  std::unordered_map<uint64_t, PendingSend> sends_;  // waiting for credit, CTS or REJECT
  uint32_t credits_used_ = 0;
  std::deque<uint64_t> waiting_;  // sends (by msg id) waiting for a credit, in post order
  MessageInbox inbox_;
  std::unordered_map<uint64_t, PendingRecv> recvs_;     // by msg id
  static constexpr uint32_t kMaxWindowsAhead = 8;  // windows granted at once into a destination
  std::unordered_map<uint32_t, uint64_t> recv_by_value_;  // notify value -> msg id
  std::unordered_map<uint64_t, std::shared_ptr<RecvWindows>> windowed_;  // by msg id
  std::unordered_set<uint64_t> granted_sends_;  // sends a CTS came for, until terminal
  // Notification values of receives the peer aborted: a WRITE_WITH_IMM of one that still lands
  // is dropped, not a protocol error (at most kMaxAborted kept, the oldest dropped first).
  std::deque<uint32_t> aborted_values_;
  static constexpr size_t kMaxAborted = 256;
  uint32_t next_value_ = 0x80000000u;  // notification values the receiver picks itself
};

}  // namespace rdmaxfer
