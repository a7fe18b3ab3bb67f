#include "transport/rdma/verbs_mr.h"

#include <cerrno>

#include "common/error.h"

namespace rdmaxfer {

VerbsMr::VerbsMr(std::shared_ptr<ProtectionDomain> pd, void* addr, uint64_t length,
                 unsigned access)
    : pd_(std::move(pd)) {
  // A zero-length registration is refused by most providers; register one byte instead (the
  // engine never addresses past `length`).
  const uint64_t n = length == 0 ? 1 : length;
  static uint8_t empty_target;
  if (length == 0) addr = &empty_target;
  mr_ = verbs().reg_mr(pd_->get(), addr, n, access);
  if (mr_ == nullptr) {
    const int e = errno != 0 ? errno : EIO;
    std::string text = errno_text("ibv_reg_mr of " + std::to_string(length) + " bytes", e);
    if (e == ENOMEM || e == EPERM || e == EAGAIN) {
      text += "; the locked-memory limit (ulimit -l) is " + memlock_limit_text() +
              ": raise it (ulimit -l unlimited, or memlock in /etc/security/limits.conf, or "
              "--ulimit memlock=-1 for containers)";
    }
    throw Error(ErrorKind::kRegistration, text, e);
  }
}

VerbsMr::~VerbsMr() {
  if (mr_ != nullptr) verbs().dereg_mr(mr_);
}

unsigned verbs_access(uint32_t access) {
  unsigned flags = IBV_ACCESS_LOCAL_WRITE;
  if (access & kAccessRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
  if (access & kAccessRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE;
  return flags;
}

RdmaRegion::RdmaRegion(std::shared_ptr<ProtectionDomain> pd, uint8_t* addr, uint64_t length,
                       uint32_t access, std::unique_ptr<PinnedAllocation> owned)
    : MemoryRegion(addr, length, access, std::move(owned)),
      mr_(std::make_unique<VerbsMr>(std::move(pd), addr, length, verbs_access(access))) {
  set_key(mr_->rkey());
}

}  // namespace rdmaxfer
