// A completion channel and the completion queue that reports on it.
//
// CompletionChannel lifecycle: created on the context (its fd made non-blocking, for epoll) ->
// the CQ poller reads events from it (several CQs may report on one channel) -> destroyed after
// its CQs (each CQ holds a shared_ptr).
//
// CompletionQueue lifecycle: created with `cqe` entries on the channel -> armed
// (req_notify) by the poller -> every event taken with get_event() is acknowledged before the
// next one is read (so destroy never waits) -> ibv_destroy_cq after every QP that uses it.
#pragma once

#include <memory>

#include "transport/rdma/verbs_context.h"

namespace rdmaxfer {

class CompletionQueue;

class CompletionChannel {
 public:
  explicit CompletionChannel(std::shared_ptr<DeviceContext> context);
  ~CompletionChannel();
  CompletionChannel(const CompletionChannel&) = delete;
  CompletionChannel& operator=(const CompletionChannel&) = delete;
  ibv_comp_channel* get() const { return channel_; }
  int fd() const { return channel_->fd; }
  // Takes one pending event and acknowledges it; returns the CompletionQueue it names, nullptr
  // when none is pending. Throws on failure.
  CompletionQueue* take_event();

 private:
  std::shared_ptr<DeviceContext> context_;
  ibv_comp_channel* channel_ = nullptr;
};

class CompletionQueue {
 public:
  CompletionQueue(std::shared_ptr<DeviceContext> context,
                  std::shared_ptr<CompletionChannel> channel, int cqe);
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  ibv_cq* get() const { return cq_; }
  int size() const { return cq_->cqe; }
  // Asks for an event on the next completion (ibv_req_notify_cq); throws on failure.
  void arm();
  // ibv_poll_cq; throws when the provider reports an error.
  int poll(int max, ibv_wc* out);

 private:
  std::shared_ptr<DeviceContext> context_;
  std::shared_ptr<CompletionChannel> channel_;
  ibv_cq* cq_ = nullptr;
};

}  // namespace rdmaxfer
