// Memory registration on verbs.
//
// VerbsMr owns one ibv_mr. Lifecycle: ibv_reg_mr over [addr, addr+length) with the given
// ibv_access_flags -> lkey for local SGEs, rkey for peers -> ibv_dereg_mr on destruction. It holds
// its PD, so the PD outlives it.
//
// RdmaRegion is the engine-visible MemoryRegion: its key() is the rkey (what descriptors carry)
// and lkey() the lkey. Access: IBV_ACCESS_LOCAL_WRITE always (a READ lands in it, a receive
// writes it), REMOTE_READ / REMOTE_WRITE only when asked for.
#pragma once

#include <memory>

#include "engine/region.h"
#include "transport/rdma/verbs_pd.h"

namespace rdmaxfer {

class VerbsMr {
 public:
  // Throws Error(kRegistration) naming ibv_reg_mr, errno and, for ENOMEM/EPERM/EAGAIN, the
  // locked-memory limit (ulimit -l).
  VerbsMr(std::shared_ptr<ProtectionDomain> pd, void* addr, uint64_t length, unsigned access);
  ~VerbsMr();
  VerbsMr(const VerbsMr&) = delete;
  VerbsMr& operator=(const VerbsMr&) = delete;

  uint32_t lkey() const { return mr_->lkey; }
  uint32_t rkey() const { return mr_->rkey; }
  uint8_t* addr() const { return static_cast<uint8_t*>(mr_->addr); }
  uint64_t length() const { return mr_->length; }

 private:
  std::shared_ptr<ProtectionDomain> pd_;
  ibv_mr* mr_ = nullptr;
};

// The ibv_access_flags for a region with the engine's Access bits.
unsigned verbs_access(uint32_t access);

class RdmaRegion : public MemoryRegion {
 public:
  RdmaRegion(std::shared_ptr<ProtectionDomain> pd, uint8_t* addr, uint64_t length,
             uint32_t access, std::unique_ptr<PinnedAllocation> owned);
  uint32_t lkey() const override { return mr_->lkey(); }

 private:
  std::unique_ptr<VerbsMr> mr_;
};

}  // namespace rdmaxfer
