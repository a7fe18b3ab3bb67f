// The completion thread of a verbs transport.
//
// Lifecycle: constructed (epoll set: the completion channel fd, the context's async-event fd,
// a wake-up eventfd) -> start(): the thread runs -> sockets are added/removed as connections
// come and go (each connection's bootstrap TCP stream, for liveness and GOODBYE) -> stop():
// wakes the thread and joins it (idempotent; the destructor calls it).
//
// Event mode (default): sleep in epoll_wait; on a channel event take and acknowledge it
// (ibv_get_cq_event / ibv_ack_cq_events), re-arm (ibv_req_notify_cq), then drain the CQ with
// ibv_poll_cq, so a completion that lands after the drain raises a new event. Busy mode:
// ibv_poll_cq in a loop, looking at the other fds every few hundred empty polls.
// The thread never touches Python; handlers run on it and must not block.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "common/unique_fd.h"
#include "transport/rdma/verbs_cq.h"

namespace rdmaxfer {

class CqPoller {
 public:
  struct Handlers {
    std::function<void(const ibv_wc* wcs, int n)> completions;
    std::function<void(const ibv_async_event& event)> async_event;
    std::function<void(uint64_t tag)> socket_ready;
    std::function<void(const std::string& error)> fatal;  // the poller itself failed
  };

  CqPoller(std::shared_ptr<DeviceContext> context, std::shared_ptr<CompletionChannel> channel,
           std::shared_ptr<CompletionQueue> cq, bool busy, Handlers handlers);
  ~CqPoller();
  CqPoller(const CqPoller&) = delete;
  CqPoller& operator=(const CqPoller&) = delete;

  void start();
  void stop();
  bool busy() const { return busy_; }

  // Reports readability / hang-up of `fd` as socket_ready(tag).
  void watch_socket(int fd, uint64_t tag);
  void unwatch_socket(int fd) noexcept;

 private:
  void run();
  void drain_cq();
  void drain_async();

  std::shared_ptr<DeviceContext> context_;
  std::shared_ptr<CompletionChannel> channel_;
  std::shared_ptr<CompletionQueue> cq_;
  const bool busy_;
  Handlers handlers_;
  UniqueFd epoll_;
  UniqueFd wake_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace rdmaxfer
