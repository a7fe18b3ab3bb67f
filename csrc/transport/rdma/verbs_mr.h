// Memory registration on verbs.
//
// VerbsMr owns one ibv_mr. Lifecycle: ibv_reg_mr over [addr, addr+length) with the given
// ibv_access_flags -> lkey for local SGEs, rkey for peers -> ibv_dereg_mr on destruction. It holds
// its PD, so the PD outlives it.
//
// RdmaRegion is the engine-visible MemoryRegion: one VerbsMr in each rail's PD (rdma_rails.h);
// its key() is the rkey on rail 0 at registration (the engine's table knows it by that),
// wire_key() the rkey on rail 0 now (what descriptors carry, with rail_keys() for the others)
// and lkey() the lkey on rail 0; lkey_on(rail) / rkey_on(rail) name the other rails' (0: no MR
// there). Access from use (core/region.h): IBV_ACCESS_LOCAL_WRITE only with
// kAccessLocalWrite (a READ lands in it, a receive writes it; a read-only mapping refuses it with
// EFAULT), REMOTE_READ / REMOTE_WRITE only when asked for. revoke() (at deregistration)
// destroys the MR at once: the rkey is dead even while the object lives on. drop_rail(rail)
// destroys the MR of one rail whose device is being removed (rdma_transport.h); a rail whose
// PD is null in the PdList (removed before the registration) gets no MR, and lkey and rkey 0
// there (a descriptor's key 0 on a rail: no access through it). add_rail(rail, pd) registers
// host memory again on a rail whose device came back (new lkey and rkey there); GPU memory is
// not registered again (its dmabuf fd is gone), and keeps no MR on that rail.
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
  uint32_t lkey() const override { return lkey_on(0); }
  // Registered while rail 0's device was away: no rkey there, and the table's key stands in
  // (a descriptor's key is never 0); its generation keeps peers from using it once rail 0 is
  // back (core/descriptor.h), and until then no lane reaches rail 0.
  uint32_t wire_key() const override {
    const uint32_t rkey = rkey_on(0);
    return rkey != 0 ? rkey : key();
  }
  std::vector<uint32_t> rail_keys() const override;
  uint32_t lkey_on(size_t rail) const { return keys_.at(rail).lkey.load(); }
  uint32_t rkey_on(size_t rail) const { return keys_.at(rail).rkey.load(); }
  int home_rail() const override { return home_rail_.load(); }
  void set_home_rail(int rail) override { home_rail_.store(rail); }
  // ibv_dereg_mr of the MR on `rail` now (its QPs are destroyed: no WR uses it any more).
  void drop_rail(size_t rail);
  // An MR in `pd` on `rail`, which has none (its device came back): false when the region is
  // revoked or GPU memory, or already has one there. Throws Error(kRegistration) as VerbsMr.
  bool add_rail(size_t rail, const std::shared_ptr<ProtectionDomain>& pd);

 protected:
  void release_handle() override;

 private:
  struct Keys {
    std::atomic<uint32_t> lkey{0};
    std::atomic<uint32_t> rkey{0};
  };
  void keep_keys();
  std::mutex mrs_mu_;  // drop_rail and add_rail against release_handle
  std::vector<std::unique_ptr<VerbsMr>> mrs_;  // null on a removed rail
  std::vector<Keys> keys_;  // per rail (sized once): read by posting threads without mrs_mu_
  bool device_ = false;     // GPU memory: not registered again on a rail that comes back
  std::atomic<int> home_rail_{-1};
};

}  // namespace rdmaxfer
