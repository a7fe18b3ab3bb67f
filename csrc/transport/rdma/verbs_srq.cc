#include "transport/rdma/verbs_srq.h"

#include <algorithm>
#include <cerrno>
#include <string>

#include "common/error.h"
#include "common/log.h"

namespace rdmaxfer {

SharedReceiveQueue::SharedReceiveQueue(std::shared_ptr<ProtectionDomain> pd, uint32_t buffer_size,
                                       uint32_t chunk, uint32_t cap)
    : pd_(std::move(pd)), buffer_size_(buffer_size) {
  const ibv_device_attr& dev = pd_->context().device_attr();
  const auto dev_max = static_cast<uint32_t>(std::max(dev.max_srq_wr, 1));
  cap_ = std::max<uint32_t>(1, std::min(cap, dev_max));
  chunk_ = std::max<uint32_t>(1, std::min(chunk, cap_));
  ibv_srq_init_attr init{};
  init.attr.max_wr = cap_;
  init.attr.max_sge = 1;
  srq_ = verbs().create_srq(pd_->get(), &init);
  if (srq_ == nullptr) {
    throw_verbs("ibv_create_srq(" + std::to_string(cap_) + " WRs) on " + pd_->context().name(),
                errno);
  }
  try {
    std::lock_guard<std::mutex> lock(mu_);
    grow_locked();
  } catch (...) {
    verbs().destroy_srq(srq_);
    throw;
  }
}

SharedReceiveQueue::~SharedReceiveQueue() {
  // Every QP attached to it is gone (they hold this object): nothing else uses the SRQ.
  const int rc = verbs().destroy_srq(srq_);
  if (rc != 0) {
    log::write(log::Level::kWarning,
               errno_text("ibv_destroy_srq on " + pd_->context().name(), rc < 0 ? -rc : rc));
  }
  slabs_.clear();  // after the SRQ: no WR names their buffers any more
}

const uint8_t* SharedReceiveQueue::buffer(uint64_t wr_id) const {
  const auto index = static_cast<uint32_t>(wr_id & 0xffffffffu);
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t slab = index / chunk_;
  if (!owns(wr_id) || slab >= slabs_.size()) {
    throw Error(ErrorKind::kProtocol,
                "receive completion for unknown SRQ buffer " + std::to_string(index));
  }
  return slabs_[slab]->slot(index % chunk_);
}

void SharedReceiveQueue::taken() {
  std::lock_guard<std::mutex> lock(mu_);
  if (posted_ > 0) --posted_;
  const auto total = static_cast<uint32_t>(slabs_.size()) * chunk_;
  if (posted_ < std::max<uint32_t>(1, total / 4) && total < cap_) grow_locked();
}

void SharedReceiveQueue::repost(uint64_t wr_id) {
  const auto index = static_cast<uint32_t>(wr_id & 0xffffffffu);
  std::lock_guard<std::mutex> lock(mu_);
  post_locked(index);
}

void SharedReceiveQueue::on_limit() {
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<uint32_t>(slabs_.size()) * chunk_ < cap_) grow_locked();
}

uint32_t SharedReceiveQueue::posted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return posted_;
}

uint32_t SharedReceiveQueue::buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<uint32_t>(slabs_.size()) * chunk_;
}

uint64_t SharedReceiveQueue::grows() const {
  std::lock_guard<std::mutex> lock(mu_);
  return grows_;
}

bool SharedReceiveQueue::limit_armed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_ok_;
}

void SharedReceiveQueue::grow_locked() {
  const auto first = static_cast<uint32_t>(slabs_.size()) * chunk_;
  if (first + chunk_ > cap_) return;
  slabs_.push_back(std::make_unique<BufferSlab>(pd_, buffer_size_, chunk_));
  if (first > 0) ++grows_;
  for (uint32_t i = 0; i < chunk_; ++i) post_locked(first + i);
  arm_locked();
}

void SharedReceiveQueue::post_locked(uint32_t index) {
  const BufferSlab& slab = *slabs_.at(index / chunk_);
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(slab.slot(index % chunk_));
  sge.length = slab.slot_size();
  sge.lkey = slab.lkey();
  ibv_recv_wr wr{};
  wr.wr_id = kWrIdFlag | index;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  const int rc = ibv_post_srq_recv(srq_, &wr, &bad);
  if (rc != 0) throw_verbs("ibv_post_srq_recv on " + pd_->context().name(), rc);
  ++posted_;
}

void SharedReceiveQueue::arm_locked() {
  const auto total = static_cast<uint32_t>(slabs_.size()) * chunk_;
  if (!limit_ok_ || total >= cap_) return;  // at the cap there is nothing to grow
  ibv_srq_attr attr{};
  attr.srq_limit = std::max<uint32_t>(1, total / 4);
  const int rc = verbs().modify_srq(srq_, &attr, IBV_SRQ_LIMIT);
  if (rc != 0) {
    // Not every provider takes a limit: the low-water check in taken() still grows the pool.
    limit_ok_ = false;
    log::write(log::Level::kInfo,
               errno_text("ibv_modify_srq(srq_limit) on " + pd_->context().name(), rc < 0 ? -rc : rc) +
                   "; the SRQ grows on the low-water check alone");
  }
}

}  // namespace rdmaxfer
