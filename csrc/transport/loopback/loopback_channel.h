// One end of a loopback connection (loopback_transport.h); the other end is a LoopbackChannel
// of another (or the same) loopback transport in this process.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "transport/channel.h"
#include "transport/closed_state.h"
#include "transport/one_sided_channel.h"
#include "transport/grant_table.h"

namespace rdmaxfer {

class LoopbackTransport;

class LoopbackChannel : public OneSidedChannel,
                        public std::enable_shared_from_this<LoopbackChannel> {
 public:
  LoopbackChannel(LoopbackTransport& transport, int lanes, std::string peer);
  void pair(const std::shared_ptr<LoopbackChannel>& peer) { peer_ = peer; }

  void send_ctrl(const CtrlMessage& message, CtrlPayload payload) override;
  Grant grant(const std::shared_ptr<MemoryRegion>& local, uint64_t offset, uint64_t length,
              uint32_t value, const RequestPtr& progress) override;
  void release_grant(uint64_t id) override;
  void post_write_notify(const RequestPtr& request, const std::shared_ptr<MemoryRegion>& local,
                         uint64_t offset, uint64_t length, uint64_t addr, uint32_t key,
                         uint32_t route, uint32_t value, const TransferOptions& options) override;
  RequestPtr new_request(OpKind op, uint64_t bytes) override;
  ChannelLimits limits() const override;
  void check_open() const override;
  void close() override;
  void abort(ErrorKind kind, const std::string& reason) override;
  bool is_closed() const override;
  std::string error() const override;
  std::string peer() const override { return peer_name_; }
  int streams() const override { return lanes_; }

  static constexpr uint64_t kEagerLimit = 4096;
  static constexpr uint64_t kCtrlRoom = 8192;
  static constexpr uint32_t kCreditWindow = 4;

 private:
  // Copies into this side's grant `key` for the peer; false when the write is outside it.
  bool land(uint32_t key, uint64_t addr, uint32_t value, const uint8_t* data, uint64_t length);
  // Runs `fn(peer)` on the peer's delivery thread, if the peer is still there.
  void to_peer(std::function<void(LoopbackChannel&)> fn);
  void start_one_sided(OpKind op, const RequestPtr& req,
                       const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                       const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                       const TransferOptions& options) override;
  void shut(ErrorKind kind, const std::string& reason, bool tell_peer);

  LoopbackTransport& transport_;
  const int lanes_;
  const std::string peer_name_;
  std::weak_ptr<LoopbackChannel> peer_;
  mutable std::mutex mu_;
  ClosedState state_;
  GrantTable grants_;
  // RDMAXFER_LOOPBACK_SWAP_CTS=1 (tests only): the first windowed CTS of each message is held
  // and delivered after the message's second, as a receiver granting from two threads may send
  // them. A message granted in one window then never gets its CTS.
  const bool swap_cts_;
  std::mutex swap_mu_;
  std::optional<CtrlMessage> held_cts_;
  std::unordered_map<uint64_t, int> cts_seen_;  // windowed CTS messages sent, by msg id
};

}  // namespace rdmaxfer
