#include "transport/rdma/verbs_mr.h"

#include <cerrno>

#include "common/error.h"
#include "cuda/gpudirect.h"

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

VerbsMr::VerbsMr(std::shared_ptr<ProtectionDomain> pd, void* device_addr, uint64_t length,
                 unsigned access, int dmabuf_fd, uint64_t dmabuf_offset)
    : pd_(std::move(pd)) {
  const uint64_t n = length == 0 ? 1 : length;
  const GpuRegistration method = dmabuf_fd >= 0 ? GpuRegistration::kDmabuf
                                                 : GpuRegistration::kPeermem;
  errno = 0;
  if (method == GpuRegistration::kDmabuf) {
    if (verbs().reg_dmabuf_mr == nullptr) {
      throw Error(ErrorKind::kUnsupported,
                  "this libibverbs lacks ibv_reg_dmabuf_mr (rdma-core >= 34 has it); upgrade "
                  "rdma-core or use nvidia-peermem");
    }
    mr_ = verbs().reg_dmabuf_mr(pd_->get(), dmabuf_offset, n,
                                reinterpret_cast<uintptr_t>(device_addr), dmabuf_fd,
                                static_cast<int>(access));
  } else {
    mr_ = verbs().reg_mr(pd_->get(), device_addr, n, access);
  }
  if (mr_ == nullptr) {
    const int e = errno != 0 ? errno : EIO;
    throw Error(ErrorKind::kRegistration, gpu_registration_error(method, length, e), e);
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

namespace rdmaxfer {

RdmaRegion::RdmaRegion(std::shared_ptr<ProtectionDomain> pd, uint8_t* device_addr,
                       uint64_t length, uint32_t access, int dmabuf_fd, uint64_t dmabuf_offset)
    : MemoryRegion(device_addr, length, access, nullptr),
      mr_(std::make_unique<VerbsMr>(std::move(pd), device_addr, length, verbs_access(access),
                                    dmabuf_fd, dmabuf_offset)) {
  set_key(mr_->rkey());
}

}  // namespace rdmaxfer
