// A registered slab of equal-sized slots: the control send slots and receive rings of a QP.
//
// Lifecycle: mmap'd (page-aligned, not mlocked: ibv_reg_mr pins it) and registered with local
// write access -> slots handed out by index -> deregistered and unmapped on destruction, after
// the QP that used it (the owner declares it before the QP).
#pragma once

#include <cstdint>
#include <memory>

#include "transport/rdma/verbs_mr.h"

namespace rdmaxfer {

class BufferSlab {
 public:
  BufferSlab(std::shared_ptr<ProtectionDomain> pd, uint32_t slot_size, uint32_t count);
  ~BufferSlab();
  BufferSlab(const BufferSlab&) = delete;
  BufferSlab& operator=(const BufferSlab&) = delete;

  uint8_t* slot(uint32_t i) const { return base_ + static_cast<uint64_t>(i) * slot_size_; }
  uint32_t slot_size() const { return slot_size_; }
  uint32_t count() const { return count_; }
  uint32_t lkey() const { return mr_->lkey(); }
  // ibv_dereg_mr now (its QP destroyed: nothing posts from or into the slab again).
  void release_mr() { mr_.reset(); }
  // Its device came back (after release_mr): registered in `pd`, the new device's PD.
  void register_in(std::shared_ptr<ProtectionDomain> pd);

 private:
  uint8_t* base_ = nullptr;
  uint64_t mapped_ = 0;
  uint32_t slot_size_;
  uint32_t count_;
  std::unique_ptr<VerbsMr> mr_;
};

}  // namespace rdmaxfer
