// A channel: one connection to one peer as a transport offers it, primitives only (UCX's UCT
// level; NCCL's net-plugin isend/irecv/test): one-sided WRITE/READ into a peer's registered
// memory, small control messages, grants (a buffer the peer may write into for one message)
// and WRITE-with-notification into them. The two-sided protocol (eager, rendezvous, credits,
// the receive step) is built on these once, in protocol/message_protocol.h.
//
// Upcalls go to the channel's ChannelEvents (the protocol), from the transport's threads, never
// with a channel lock held: control messages in the order the peer sent them, notifications,
// and on_closed once when the channel closes (after it marked itself closed and failed its own
// requests' work).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/descriptor.h"
#include "core/region.h"
#include "core/request.h"
#include "core/stats.h"
#include "transport/ctrl_message.h"

namespace rdmaxfer {

// Per-transfer knobs; 0 means "choose from the transfer size".
struct TransferOptions {
  uint64_t chunk_size = 0;  // bytes per wire chunk / work request
  int streams = 0;          // how many of the connection's streams (or QPs) to spread over
};

// What one channel's control messages can carry, and how many may be unanswered at once.
struct ChannelLimits {
  uint64_t eager_limit = 0;    // messages up to this many bytes travel inside a control message
  uint64_t ctrl_room = 0;      // bytes of metadata + data one control message carries
  uint32_t credit_window = 0;  // messages announced and not yet answered; 0: no limit (the
                               // byte stream's own flow control bounds the peer)
};

class ChannelEvents {
 public:
  virtual ~ChannelEvents() = default;
  // A control message from the peer.
  virtual void on_ctrl(CtrlMessage message) = 0;
  // A post_write_notify of the peer into one of our grants has landed whole.
  virtual void on_notify(uint32_t value) = 0;
  // The channel closed with `why`: fail everything the protocol holds.
  virtual void on_closed(const Error& why) = 0;
};

class Channel {
 public:
  // `engine_stats`: the engine's counters, which also receive every count of this channel.
  explicit Channel(std::shared_ptr<Stats> engine_stats = nullptr)
      : stats_(std::make_shared<Stats>(std::move(engine_stats))) {}
  virtual ~Channel() = default;

  // One-sided: copy `length` bytes between local[local_offset:] and the peer's region named by
  // `remote` at remote.addr + remote_offset, chunked and striped over the lanes. Completes when
  // the bytes are placed remotely (WRITE) or locally (READ).
  virtual RequestPtr post_write(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                                const Descriptor& remote, uint64_t remote_offset,
                                uint64_t length, const TransferOptions& options) = 0;
  virtual RequestPtr post_read(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                               const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                               const TransferOptions& options) = 0;

  // A control message to the peer, in order with the earlier ones; `payload` (an EAGER
  // message's bytes) is held until sent or copied. A failure closes the channel.
  virtual void send_ctrl(const CtrlMessage& message, CtrlPayload payload) = 0;
  // Lets the peer write local[offset, offset+length) for one message, notifying `value`; the
  // grant's addr, key and route go to the peer in a CTS. Bytes landing count as `progress`'s.
  // Released by release_grant (or by the channel closing; verbs keeps it until the flushes are
  // drained).
  virtual Grant grant(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                      uint64_t length, uint32_t value, const RequestPtr& progress) = 0;
  virtual void release_grant(uint64_t id) = 0;
  // WRITEs local[offset, offset+length) to the peer's grant (addr, key, route: Grant); the
  // peer's on_notify(value) fires once every byte is in place. Drives `request` (its parts):
  // done when the bytes have left (TCP: into the sockets; verbs: the WRs completed).
  virtual void post_write_notify(const RequestPtr& request,
                                 const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                                 uint64_t length, uint64_t addr, uint32_t key, uint32_t route,
                                 uint32_t value, const TransferOptions& options) = 0;
  // A request of this channel (verbs: waiting on it drives the CQ).
  virtual RequestPtr new_request(OpKind op, uint64_t bytes) = 0;
  virtual ChannelLimits limits() const = 0;
  // Throws the channel's closed (or not-yet-connected) error; returns when it is open.
  virtual void check_open() const = 0;

  // Graceful close: tell the peer, fail what is still pending, release sockets/QPs.
  virtual void close() = 0;
  // close() without its wait for the teardown to finish, so an engine closing many channels
  // waits for them together (close() afterwards waits). Where close() does not wait, the same.
  virtual void begin_close() { close(); }
  // Immediate teardown after an error or timeout: every pending request fails with `reason`.
  virtual void abort(ErrorKind kind, const std::string& reason) = 0;
  virtual bool is_closed() const = 0;
  virtual std::string error() const = 0;
  virtual std::string peer() const = 0;
  virtual int streams() const = 0;
  // One line naming the peer, the streams and what was negotiated with the peer.
  virtual std::string describe() const;
  // What was negotiated, by name (verbs: path_mtu in bytes, max_rd_atomic, ...).
  virtual std::vector<std::pair<std::string, uint64_t>> attributes() const { return {}; }
  // What was negotiated that is a name, not a number (ofi: the provider, fabric and domain).
  virtual std::vector<std::pair<std::string, std::string>> names() const { return {}; }

  // Set once by the transport before the channel starts (transport.h: ProtocolFactory).
  void attach(std::shared_ptr<ChannelEvents> events) { events_ = std::move(events); }
  const std::shared_ptr<ChannelEvents>& events() const { return events_; }

  // This channel's counters (core/stats.h): its one-sided operations and lane bytes, and the
  // protocol's messages (protocol/message_protocol.h counts there).
  const std::shared_ptr<Stats>& stats() const { return stats_; }
  // Counts the refused attempts that the connect which made this channel retried.
  void count_retries(int retries) {
    for (int i = 0; i < retries; ++i) stats_->add_retry();
  }
  // The engine at the other end (its id from the bootstrap's Hello), set by the transport
  // before the channel is handed out: one-sided requests then take only descriptors of
  // regions that engine registered (check_peer_engine). 0: not known, not checked.
  void set_peer_engine(uint64_t id) { peer_engine_ = id; }
  // Throws Error(kInvalidArgument) when `remote` names a region of another engine than the
  // peer's (a descriptor passed to the wrong endpoint), before anything is posted.
  void check_peer_engine(const Descriptor& remote, const char* what) const;

 protected:

  // Counts `request` (a one-sided operation of `kind`: "write", "read") once it is terminal.
  void count_when_terminal(const RequestPtr& request, const char* kind) {
    request->set_on_terminal(
        [stats = stats_, kind](const Request& done) { count_terminal(*stats, done, kind); });
  }

  // Shared with the streams that count into it (they may outlive the channel).
  const std::shared_ptr<Stats> stats_;

 private:
  std::shared_ptr<ChannelEvents> events_;
  uint64_t peer_engine_ = 0;
};

}  // namespace rdmaxfer
