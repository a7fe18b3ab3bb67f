// Memory registration on verbs.
//
// VerbsMr owns one ibv_mr. Lifecycle: ibv_reg_mr over [addr, addr+length) with the given
// ibv_access_flags -> lkey for local SGEs, rkey for peers -> ibv_dereg_mr on destruction. It holds
// its PD, so the PD outlives it.
//
// RdmaRegion is the engine-visible MemoryRegion: one VerbsMr in each rail's PD (rdma_rails.h);
// its key() is the rkey on rail 0 (what descriptors carry, with rail_keys() for the others) and
// lkey() the lkey on rail 0; lkey_on(rail) / rkey_on(rail) name the other rails'. Access from use (core/region.h): IBV_ACCESS_LOCAL_WRITE only with
// kAccessLocalWrite (a READ lands in it, a receive writes it; a read-only mapping refuses it with
// EFAULT), REMOTE_READ / REMOTE_WRITE only when asked for. revoke() (at deregistration)
// destroys the MR at once: the rkey is dead even while the object lives on. drop_rail(rail)
// destroys the MR of one rail whose device is being removed (rdma_transport.h); a rail whose
// PD is null in the PdList (removed before the registration) gets no MR, and lkey and rkey 0
// there (a descriptor's key 0 on a rail: no access through it).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "core/region.h"
#include "transport/rdma/verbs_pd.h"

namespace rdmaxfer {

class VerbsMr {
 public:
  // Throws Error(kRegistration) naming ibv_reg_mr, errno and, for ENOMEM/EPERM/EAGAIN, the
  // locked-memory limit (ulimit -l).
  VerbsMr(std::shared_ptr<ProtectionDomain> pd, void* addr, uint64_t length, unsigned access);
  // GPU memory (GPUDirect RDMA, cuda/gpudirect.h): ibv_reg_dmabuf_mr over the dmabuf fd when
  // dmabuf_fd >= 0, else ibv_reg_mr on the device address (nvidia-peermem). Throws
  // Error(kRegistration) naming the cause and the fix, Error(kUnsupported) when this
  // libibverbs lacks ibv_reg_dmabuf_mr.
  VerbsMr(std::shared_ptr<ProtectionDomain> pd, void* device_addr, uint64_t length,
          unsigned access, int dmabuf_fd, uint64_t dmabuf_offset);
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

using PdList = std::vector<std::shared_ptr<ProtectionDomain>>;

class RdmaRegion : public MemoryRegion {
 public:
  RdmaRegion(const PdList& pds, uint8_t* addr, uint64_t length, uint32_t access,
             std::unique_ptr<PinnedAllocation> owned);
  // GPU memory registered for GPUDirect RDMA (see VerbsMr's device constructor).
  RdmaRegion(const PdList& pds, uint8_t* device_addr, uint64_t length, uint32_t access,
             int dmabuf_fd, uint64_t dmabuf_offset);
  uint32_t lkey() const override { return lkeys_[0]; }
  std::vector<uint32_t> rail_keys() const override {
    return std::vector<uint32_t>(rkeys_.begin() + 1, rkeys_.end());
  }
  uint32_t lkey_on(size_t rail) const { return lkeys_.at(rail); }
  uint32_t rkey_on(size_t rail) const { return rkeys_.at(rail); }
  int home_rail() const override { return home_rail_.load(); }
  void set_home_rail(int rail) override { home_rail_.store(rail); }
  // ibv_dereg_mr of the MR on `rail` now (its QPs are destroyed: no WR uses it any more).
  void drop_rail(size_t rail);

 protected:
  void release_handle() override;

 private:
  void keep_keys();
  std::mutex mrs_mu_;  // drop_rail against release_handle
  std::vector<std::unique_ptr<VerbsMr>> mrs_;  // null on a removed rail
  std::vector<uint32_t> lkeys_;
  std::vector<uint32_t> rkeys_;
  std::atomic<int> home_rail_{-1};
};

}  // namespace rdmaxfer
