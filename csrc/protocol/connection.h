// A connection to one peer as the engine and the bindings use it: the transport's channel
// (one-sided WRITE/READ, teardown; transport/channel.h) with the two-sided protocol over it
// (protocol/message_protocol.h). Whatever the transport, every operation below means the same.
//
// Lifecycle: made by accept/connect below from a started channel -> operations -> close() or
// abort() (every pending request fails with the reason). Dropping the last reference drops the
// channel (the transport holds it weakly), which tears it down.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "protocol/batch.h"
#include "protocol/message_protocol.h"
#include "transport/transport.h"

namespace rdmaxfer {

class Connection {
 public:
  // `channel` must have been made by a transport whose protocol factory is
  // make_message_protocol (Engine sets it).
  explicit Connection(std::shared_ptr<Channel> channel);

  RequestPtr post_write(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                        const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                        const TransferOptions& options) {
    return channel_->post_write(local, local_offset, remote, remote_offset, length, options);
  }
  RequestPtr post_read(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                       const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                       const TransferOptions& options) {
    return channel_->post_read(local, local_offset, remote, remote_offset, length, options);
  }
  // A batch of WRITEs or READs (protocol/batch.h); a WRITE batch may end with a notification.
  std::shared_ptr<BatchRun> post_batch(std::shared_ptr<const BatchPlan> plan,
                                       std::optional<NotifyPayload> notify, uint32_t window,
                                       bool whole) {
    return BatchRun::start(channel_, std::move(plan), std::move(notify), window, whole);
  }
  // Two-sided: a message of `length` bytes with opaque `meta` (dtype, shape...). The receiver
  // first gets the header (post_recv_header), then places the bytes (post_recv) or refuses them
  // (reject), so a mismatch is caught before any byte is written.
  // `eager`: false for device memory the CPU cannot read (GPUDirect).
  RequestPtr post_send(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                       uint64_t length, const std::string& meta, const TransferOptions& options,
                       bool eager = true) {
    return protocol_->post_send(local, offset, length, meta, options, eager);
  }
  RequestPtr post_recv_header() { return protocol_->post_recv_header(); }
  RequestPtr post_recv(uint64_t msg_id, const std::shared_ptr<MemoryRegion>& local,
                       uint64_t offset, uint64_t length) {
    return protocol_->post_recv(msg_id, local, offset, length);
  }
  void reject(uint64_t msg_id, const std::string& reason) { protocol_->reject(msg_id, reason); }
  // Withdraws a header wait that has not matched a message yet; true when withdrawn.
  bool cancel_recv_header(const RequestPtr& request) {
    return protocol_->cancel_recv_header(request);
  }

  void close() { channel_->close(); }
  void begin_close() { channel_->begin_close(); }
  void abort(ErrorKind kind, const std::string& reason) { channel_->abort(kind, reason); }
  bool is_closed() const { return channel_->is_closed(); }
  std::string error() const { return channel_->error(); }
  std::string peer() const { return channel_->peer(); }
  int streams() const { return channel_->streams(); }
  std::string describe() const { return channel_->describe(); }
  // The channel's negotiated values, then the protocol's (credit window and queues).
  std::vector<std::pair<std::string, uint64_t>> attributes() const;
  std::vector<std::pair<std::string, std::string>> names() const { return channel_->names(); }
  Channel& channel() { return *channel_; }
  // The two-sided protocol itself (the staging pipeline's windowed messages).
  MessageProtocol& protocol() { return *protocol_; }
  // The transport carrying this connection ("tcp", "rdma", "shm") and, with transport="auto",
  // why shm was not chosen ("" when it was or was never in question; engine/wireup.h).
  void set_transport(std::string name, std::string note) {
    transport_ = std::move(name);
    transport_note_ = std::move(note);
  }
  const std::string& transport() const { return transport_; }
  const std::string& transport_note() const { return transport_note_; }
  // This endpoint's counters (core/stats.h), kept by its channel.
  const Stats& stats() const { return *channel_->stats(); }

 private:
  std::shared_ptr<Channel> channel_;
  std::shared_ptr<MessageProtocol> protocol_;
  std::string transport_;
  std::string transport_note_;
};

// The ProtocolFactory (transport.h) every engine gives its transport, bound to the engine's
// notification queue and its bound on the messages peers announce (0: none).
std::shared_ptr<ChannelEvents> make_message_protocol(
    const std::shared_ptr<Channel>& channel,
    const std::shared_ptr<NotificationQueue>& notifications, uint64_t max_message_bytes);

}  // namespace rdmaxfer
