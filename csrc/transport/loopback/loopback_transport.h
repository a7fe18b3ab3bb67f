// The loopback transport: an in-process test transport that supplies only the primitives
// (channel.h), with memcpy for the wire and no sockets or verbs. It proves that the protocol
// (protocol/message_protocol.h) runs on any transport that has them. Internal: make_transport
// builds it by the name "loopback", but available_transports() does not list it.
//
// Lifecycle: constructed (its delivery thread running) -> listen(): a port in this process's
// table of loopback listeners -> connect() from another loopback engine of the process pairs two
// channels, the accepting one queued for accept() -> shutdown(): every channel aborted, the
// thread joined, the port freed.
//
// Control messages, notifications and the peer's close reach a channel's protocol on the
// delivery thread of the channel's own transport, in the order they were sent. One-sided
// WRITE/READ and post_write_notify copy at once, checked like TCP: a WRITE/READ against the
// peer's RegionTable (kRemoteAccess, nothing copied, when refused), a notified write against the
// peer's grant (outside it: a protocol error that closes both channels).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/transport.h"

namespace rdmaxfer {

class LoopbackChannel;

class LoopbackTransport : public Transport {
 public:
  explicit LoopbackTransport(uint64_t engine_id);
  ~LoopbackTransport() override;

  static Capabilities declared();
  Capabilities capabilities() const override { return declared(); }
  std::string describe() const override;
  uint16_t listen(const std::string& host, uint16_t port) override;
  std::shared_ptr<Channel> accept(double timeout_s) override;
  std::shared_ptr<Channel> connect(const std::string& host, uint16_t port,
                                   const ConnectOptions& options) override;
  void shutdown() override;

  // Runs `fn` on this transport's delivery thread (dropped after shutdown).
  void deliver(std::function<void()> fn);

 protected:
  std::shared_ptr<MemoryRegion> make_region(uint8_t* addr, uint64_t length, uint32_t access,
                                            std::unique_ptr<PinnedAllocation> owned) override;

 private:
  std::shared_ptr<LoopbackChannel> make_channel(int lanes, std::string peer);
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  bool shut_down_ = false;
  uint16_t port_ = 0;
  std::deque<std::function<void()>> queue_;
  std::deque<std::shared_ptr<LoopbackChannel>> accepted_;
  std::vector<std::weak_ptr<LoopbackChannel>> channels_;
  std::thread thread_;
};

}  // namespace rdmaxfer
