// The completion queues of one rail of a verbs transport (rdma_rails.h), created on demand.
//
// Every QP's sends and receives complete on one CQ of its rail, which must never overrun, so a
// connection reserves send-queue + receive-queue depth entries per QP on one CQ of each rail
// it has QPs on. When no CQ has room, a new one of `entries_per_cq` entries (min(16384, the
// devices' max_cqe)) is created on the rail's completion channel and handed to its poller
// (cq_poller.h), so the connection count is bounded by kMaxCqs CQs rather than by one CQ
// (16,384 / 288 entries per default connection = 56 connections). A reservation is returned when its connection is forgotten; CQs stay
// until the transport goes.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "transport/rdma/cq_poller.h"

namespace rdmaxfer {

class CqSet {
 public:
  CqSet(std::shared_ptr<DeviceContext> context, std::shared_ptr<CompletionChannel> channel,
        std::shared_ptr<CqPoller> poller, int entries_per_cq);

  // A CQ with `entries` free for connection `tag`. Throws Error(kConnection) when one
  // connection needs more than a CQ holds, or when every CQ the poller may serve is full;
  // Error(kTransport) when ibv_create_cq fails.
  std::shared_ptr<CompletionQueue> reserve(uint32_t tag, int entries);
  // Gives back the entries of `tag` (nothing when it holds none).
  void release(uint32_t tag);
  int cq_count() const;

 private:
  struct Slot {
    std::shared_ptr<CompletionQueue> cq;
    int reserved = 0;
  };
  std::shared_ptr<DeviceContext> context_;
  std::shared_ptr<CompletionChannel> channel_;
  std::shared_ptr<CqPoller> poller_;
  const int entries_per_cq_;
  mutable std::mutex mu_;
  std::vector<Slot> slots_;
  std::unordered_map<uint32_t, std::pair<size_t, int>> by_tag_;  // tag -> (slot, entries)
};

}  // namespace rdmaxfer
