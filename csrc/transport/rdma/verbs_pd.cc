#include "transport/rdma/verbs_pd.h"

#include <cerrno>

namespace rdmaxfer {

ProtectionDomain::ProtectionDomain(std::shared_ptr<DeviceContext> context)
    : context_(std::move(context)) {
  pd_ = verbs().alloc_pd(context_->get());
  if (pd_ == nullptr) throw_verbs("ibv_alloc_pd", errno);
}

ProtectionDomain::~ProtectionDomain() {
  if (pd_ != nullptr) verbs().dealloc_pd(pd_);
}

}  // namespace rdmaxfer
