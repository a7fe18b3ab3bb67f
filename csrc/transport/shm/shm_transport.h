// The shm transport: processes on one host, with no socket on the data path (issue 14).
//
// Addressing is TCP's: listen(host, port) binds the abstract UNIX socket "rdmaxfer-shm:PORT"
// (abstract: no file is created, nothing outlives the process; per network namespace) after
// checking that `host` is an address of this machine; connect(host, port) reaches it only when
// `host` is local. The bootstrap runs the same Hello and HMAC challenge as TCP (bootstrap.h)
// over that socket, then ShmChannel::establish sets up the rings and checks that both ends
// share a kernel, network and PID namespace and user, and that CMA works between them.
//
// In an engine with transport="auto" it is the companion of the network transport (the
// Transport(owner) constructor; engine/wireup.h): it listens on the network listener's port
// number and serves that transport's registrations.
//
// Lifecycle: constructed -> listen() (an acceptor thread) -> channels from accept()/connect()
// -> shutdown(): every channel aborted, the acceptor joined, the reader threads waited for.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "common/work_queue.h"
#include "transport/bootstrap.h"
#include "transport/handshake_pool.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace rdmaxfer {

class ShmChannel;

class ShmTransport : public Transport {
 public:
  // `config`: its secret guards the handshake, its poll mode drives the waits.
  ShmTransport(uint64_t engine_id, const TransportConfig& config);
  // The same-host companion of `owner` (transport.h).
  ShmTransport(Transport& owner, const TransportConfig& config);
  ~ShmTransport() override;

  static Capabilities declared();
  Capabilities capabilities() const override { return declared(); }
  std::string describe() const override;
  uint16_t listen(const std::string& host, uint16_t port) override;
  std::shared_ptr<Channel> accept(double timeout_s) override;
  std::shared_ptr<Channel> connect(const std::string& host, uint16_t port,
                                   const ConnectOptions& options) override;
  void shutdown() override;

  const std::string& secret() const { return config_.secret; }
  PollMode poll_mode() const { return config_.poll_mode; }
  // The spin budget of a caller's wait that reads a channel's ring (ShmChannel::drive).
  SpinBudget& wait_budget() { return wait_budget_; }
  // The threads that copy the channels' gathered groups (shm_gather.cc), one per core up to 4,
  // started with the first group: several groups are copied at once, each on one thread.
  WorkQueue& gather_workers() { return gather_workers_; }
  // Reader threads of the channels (shm_channel.h) count themselves in and out.
  void reader_started();
  void reader_finished();

 protected:
  std::shared_ptr<MemoryRegion> make_region(uint8_t* addr, uint64_t length, uint32_t access,
                                            std::unique_ptr<PinnedAllocation> owned) override;
  // Device memory, exported for CUDA IPC (shm/cuda_ipc.h); the dmabuf arguments are unused.
  std::shared_ptr<MemoryRegion> make_device_region(uint8_t* addr, uint64_t length,
                                                   uint32_t access, int dmabuf_fd,
                                                   uint64_t dmabuf_offset) override;

 private:
  void check_usable() const;
  void run_acceptor();
  // One client's handshake and ring set-up, on its own thread of handshakes_.
  void accept_client(UniqueFd fd, const std::string& peer);
  void adopt(const std::shared_ptr<ShmChannel>& channel);

  const TransportConfig config_;
  SpinBudget wait_budget_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool shut_down_ = false;
  uint16_t port_ = 0;
  UniqueFd listen_fd_;
  std::thread acceptor_;
  HandshakePool handshakes_{Acceptor::kMaxHandshakes};
  std::deque<std::shared_ptr<ShmChannel>> accepted_;
  std::vector<std::weak_ptr<ShmChannel>> channels_;
  int readers_ = 0;
  // Last: stopped (queued groups dropped, running ones finished) before the rest goes.
  WorkQueue gather_workers_;
};

}  // namespace rdmaxfer
