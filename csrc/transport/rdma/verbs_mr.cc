#include "transport/rdma/verbs_mr.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"
#include "cuda/gpudirect.h"

namespace rdmaxfer {

namespace {
// With RDMAV_FORK_SAFE, libibverbs marks every page an MR touches MADV_DONTFORK, so a child of
// fork() has none of them: for a buffer that is not page-aligned that also removes whatever
// else shares its first and last page (other heap objects, malloc's chunk headers), and the
// child crashes when it touches them. Those two pages are handed back to fork (MADV_DOFORK):
// since Linux 5.9 fork() copies pinned pages for the child at once ("early COW"), so the
// parent's pinned page stays where the device writes. The whole pages inside the buffer stay
// out of the child, as libibverbs intends.
void keep_edge_pages_in_child(const void* addr, uint64_t length) {
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uint64_t>(addr);
  const uint64_t end = begin + length;
  if (begin % page != 0) {
    madvise(reinterpret_cast<void*>(begin / page * page), page, MADV_DOFORK);
  }
  if (end % page != 0 && end / page != begin / page) {
    madvise(reinterpret_cast<void*>(end / page * page), page, MADV_DOFORK);
  }
}
}  // namespace

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
    if (e == EFAULT && (access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)) == 0) {
      text += "; the memory is registered read-only, but kernels before 6.2 pin every MR's "
              "pages for writing, which a read-only shared mapping (mmap ACCESS_READ of a file) "
              "refuses: map the file privately (mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, "
              "prot=mmap.PROT_READ)) or use Linux >= 6.2";
    } else if (e == EFAULT) {
      text += "; registering with write access (LOCAL_WRITE or REMOTE_WRITE) needs writable "
              "memory: register read-only memory as a source only (access='r')";
    }
    throw Error(ErrorKind::kRegistration, text, e);
  }
  if (length > 0) keep_edge_pages_in_child(addr, length);
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
  unsigned flags = 0;
  if (access & kAccessLocalWrite) flags |= IBV_ACCESS_LOCAL_WRITE;
  if (access & kAccessRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
  if (access & kAccessRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE;
  return flags;
}

RdmaRegion::RdmaRegion(const PdList& pds, uint8_t* addr, uint64_t length, uint32_t access,
                       std::unique_ptr<PinnedAllocation> owned)
    : MemoryRegion(addr, length, access, std::move(owned)) {
  for (const auto& pd : pds) {
    mrs_.push_back(pd ? std::make_unique<VerbsMr>(pd, addr, length, verbs_access(access))
                      : nullptr);
  }
  keep_keys();
}

void RdmaRegion::keep_keys() {
  keys_ = std::vector<Keys>(mrs_.size());
  for (size_t r = 0; r < mrs_.size(); ++r) {
    keys_[r].lkey.store(mrs_[r] ? mrs_[r]->lkey() : 0);
    keys_[r].rkey.store(mrs_[r] ? mrs_[r]->rkey() : 0);
  }
  set_key(rkey_on(0));
}

std::vector<uint32_t> RdmaRegion::rail_keys() const {
  std::vector<uint32_t> out;
  for (size_t r = 1; r < keys_.size(); ++r) out.push_back(keys_[r].rkey.load());
  return out;
}

void RdmaRegion::drop_rail(size_t rail) {
  std::lock_guard<std::mutex> lock(mrs_mu_);
  if (rail >= keys_.size()) return;
  keys_[rail].lkey.store(0);
  keys_[rail].rkey.store(0);
  if (rail < mrs_.size()) mrs_[rail].reset();
}

bool RdmaRegion::add_rail(size_t rail, const std::shared_ptr<ProtectionDomain>& pd) {
  std::lock_guard<std::mutex> lock(mrs_mu_);
  if (device_ || rail >= mrs_.size() || mrs_[rail] || revoked()) return false;
  mrs_[rail] = std::make_unique<VerbsMr>(pd, addr(), length(), verbs_access(access()));
  keys_[rail].lkey.store(mrs_[rail]->lkey());
  keys_[rail].rkey.store(mrs_[rail]->rkey());
  return true;
}

void RdmaRegion::release_handle() {
  std::lock_guard<std::mutex> lock(mrs_mu_);
  mrs_.clear();
}

}  // namespace rdmaxfer

namespace rdmaxfer {

RdmaRegion::RdmaRegion(const PdList& pds, uint8_t* device_addr, uint64_t length,
                       uint32_t access, int dmabuf_fd, uint64_t dmabuf_offset)
    : MemoryRegion(device_addr, length, access, nullptr), device_(true) {
  for (const auto& pd : pds) {
    mrs_.push_back(pd ? std::make_unique<VerbsMr>(pd, device_addr, length, verbs_access(access),
                                                  dmabuf_fd, dmabuf_offset)
                      : nullptr);
  }
  keep_keys();
}

}  // namespace rdmaxfer
