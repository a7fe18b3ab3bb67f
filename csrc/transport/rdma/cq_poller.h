// The completion thread of a verbs transport.
//
// Lifecycle: constructed (epoll set: the completion channel fd, the context's async-event fd,
// a wake-up eventfd) -> start(): the thread runs -> CQs are added as the transport needs them
// (add_cq; every CQ reports on the one channel; at most kMaxCqs, never removed before the
// poller goes) and sockets are added/removed as connections come and go (each connection's
// bootstrap TCP stream, for liveness and GOODBYE) -> stop(): wakes the thread and joins it
// (idempotent; the destructor calls it).
//
// Event mode (default): sleep in epoll_wait; on a channel event take and acknowledge it
// (ibv_get_cq_event / ibv_ack_cq_events), re-arm the CQ it names (ibv_req_notify_cq), then
// drain every CQ with ibv_poll_cq, so a completion that lands after the drain raises a new
// event. Busy mode: ibv_poll_cq in a loop, looking at the other fds every few hundred empty
// polls.
// The thread never touches Python; handlers run on it and must not block.
//
// Caller-driven progress (core/request.h Progress): a thread waiting on a request may call
// progress(), which polls the CQs once and dispatches what it found on the calling thread.
// Every ibv_poll_cq and the dispatch of its completions happen under one mutex (poll_mu_), so
// completions are handed to the connections in CQ order whichever thread polls (a connection's
// QPs on one rail all use one CQ of that rail's poller). The completion thread takes poll_mu_
// blocking and drains the CQs to empty after every re-arm, so a completion that a caller
// leaves in a CQ is never stranded: it either raised an event after the last
// re-arm or the drain that follows that re-arm sees it. Callers only try-lock (a caller never
// waits behind the thread, and a handler that waits on a request cannot deadlock on itself).
// After stop() progress() dispatches nothing (the handlers may point at a dying transport).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "core/request.h"
#include "transport/rdma/verbs_cq.h"

namespace rdmaxfer {

class CqPoller : public Progress {
 public:
  struct Handlers {
    std::function<void(const ibv_wc* wcs, int n)> completions;
    std::function<void(const ibv_async_event& event)> async_event;
    std::function<void(uint64_t tag)> socket_ready;
    std::function<void(const std::string& error)> fatal;  // the poller itself failed
  };

  // CQs one poller serves (each of min(16384, max_cqe) entries: room for 56 connections of
  // 288 entries each per CQ, so about 3,500 connections in all).
  static constexpr int kMaxCqs = 64;

  CqPoller(std::shared_ptr<DeviceContext> context, std::shared_ptr<CompletionChannel> channel,
           bool busy, Handlers handlers);
  ~CqPoller() override;
  CqPoller(const CqPoller&) = delete;
  CqPoller& operator=(const CqPoller&) = delete;

  void start();
  void stop();
  // Starts polling `cq` (created on this poller's channel; armed here in event mode). Throws
  // Error(kConnection) when kMaxCqs are in use. Thread-safe.
  void add_cq(std::shared_ptr<CompletionQueue> cq);
  int cq_count() const { return n_cqs_.load(std::memory_order_acquire); }
  bool busy() const { return busy_; }

  // Progress: one non-blocking ibv_poll_cq and the dispatch of what it returned, on the calling
  // thread; false when another thread is polling, nothing was there, or the poller stopped.
  bool progress() override;

  // True on a thread that is dispatching completions (a handler): it must not wait for more.
  static bool dispatching();
  // False once stop() began: no completion is delivered any more.
  bool running() const { return !stop_.load(); }

  // Reports readability / hang-up of `fd` as socket_ready(tag).
  void watch_socket(int fd, uint64_t tag);
  void unwatch_socket(int fd) noexcept;

 private:
  void run();
  void drain_cq();
  // ibv_poll_cq + dispatch of up to one batch from each CQ; poll_mu_ held. Returns true when
  // some CQ filled its batch (more may be waiting).
  bool poll_once_locked(int* found);
  void drain_async();

  std::shared_ptr<DeviceContext> context_;
  std::shared_ptr<CompletionChannel> channel_;
  // CQs in polling order: slots filled by add_cq under cqs_mu_, published by n_cqs_ (release),
  // read without a lock by the pollers. owned_ keeps them alive.
  std::array<CompletionQueue*, kMaxCqs> cqs_{};
  std::atomic<int> n_cqs_{0};
  std::mutex cqs_mu_;
  std::vector<std::shared_ptr<CompletionQueue>> owned_;
  const bool busy_;
  Handlers handlers_;
  UniqueFd epoll_;
  UniqueFd wake_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex poll_mu_;     // serialises ibv_poll_cq + dispatch (thread and callers)
  bool stopped_ = false;   // under poll_mu_: no more dispatch
  const uint64_t fork_generation_;  // in a child of fork() the CQ is the parent's: never poll
  bool failed_ = false;    // under poll_mu_: polling failed, the fatal handler ran
};

}  // namespace rdmaxfer
