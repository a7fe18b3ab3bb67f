#include "transport/rdma/cq_set.h"

#include "common/error.h"

namespace rdmaxfer {

CqSet::CqSet(std::shared_ptr<DeviceContext> context, std::shared_ptr<CompletionChannel> channel,
             std::shared_ptr<CqPoller> poller, int entries_per_cq)
    : context_(std::move(context)),
      channel_(std::move(channel)),
      poller_(std::move(poller)),
      entries_per_cq_(entries_per_cq) {}

std::shared_ptr<CompletionQueue> CqSet::reserve(uint32_t tag, int entries) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t chosen = slots_.size();
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].reserved + entries <= slots_[i].cq->size()) {
      chosen = i;
      break;
    }
  }
  if (chosen == slots_.size()) {
    if (entries > entries_per_cq_) {
      throw Error(ErrorKind::kConnection,
                  "this rdma connection needs " + std::to_string(entries) +
                      " completion queue entries, more than one CQ of this device holds (" +
                      std::to_string(entries_per_cq_) + "); use fewer QPs (streams=) or a "
                      "shallower send queue (sq_depth=)");
    }
    auto cq = std::make_shared<CompletionQueue>(context_, channel_, entries_per_cq_);
    poller_->add_cq(cq);
    slots_.push_back(Slot{std::move(cq), 0});
  }
  slots_[chosen].reserved += entries;
  by_tag_[tag] = {chosen, entries};
  return slots_[chosen].cq;
}

void CqSet::release(uint32_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_tag_.find(tag);
  if (it == by_tag_.end()) return;
  slots_[it->second.first].reserved -= it->second.second;
  by_tag_.erase(it);
}

int CqSet::cq_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(slots_.size());
}

}  // namespace rdmaxfer
