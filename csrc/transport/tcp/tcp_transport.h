// The TCP transport: the whole API over plain TCP streams, for machines without RDMA.
//
// Lifecycle: constructed (I/O threads running) -> listen() (acceptor thread) -> connections
// created by accept()/connect() -> shutdown(): every connection aborted, threads joined.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "transport/bootstrap.h"
#include "transport/tcp/io_loop.h"
#include "transport/tcp/tcp_connection.h"
#include "transport/transport.h"

namespace rdmaxfer {

class TcpTransport : public Transport {
 public:
  TcpTransport(uint64_t engine_id, const TcpConfig& config);
  ~TcpTransport() override;

  // What every TCP transport can do (registered in tcp_registration.cc).
  static Capabilities declared();
  Capabilities capabilities() const override { return declared(); }
  std::string describe() const override;
  uint16_t listen(const std::string& host, uint16_t port) override;
  std::shared_ptr<Channel> accept(double timeout_s) override;
  std::shared_ptr<Channel> connect(const std::string& host, uint16_t port,
                                      const ConnectOptions& options) override;
  void shutdown() override;

 protected:
  std::shared_ptr<MemoryRegion> make_region(uint8_t* addr, uint64_t length, uint32_t access,
                                            std::unique_ptr<PinnedAllocation> owned) override;

 private:
  // `peer_engine`: the peer's engine id from the handshake (descriptors are checked against it).
  std::shared_ptr<Channel> adopt(std::vector<UniqueFd> fds,
                                 std::vector<std::unique_ptr<TlsSession>> tls,
                                 const std::string& peer, uint64_t peer_engine);
  SocketOptions socket_options() const;

  TcpConfig config_;
  std::shared_ptr<const TlsContext> tls_;  // null: plain TCP
  // Connects in their handshake, ended by shutdown() (transport/socket.h).
  std::shared_ptr<PendingConnects> connects_ = std::make_shared<PendingConnects>();
  std::vector<std::unique_ptr<IoLoop>> loops_;
  size_t next_loop_ = 0;
  std::unique_ptr<Acceptor> acceptor_;
  std::mutex mu_;
  bool shut_down_ = false;
  std::vector<std::weak_ptr<TcpConnection>> connections_;
};

}  // namespace rdmaxfer
