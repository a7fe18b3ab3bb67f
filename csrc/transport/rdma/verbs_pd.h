// A protection domain: one per engine; every MR and QP of the engine lives in it.
//
// Lifecycle: allocated on an open DeviceContext (held by shared_ptr, so the context outlives
// it) -> MRs and QPs hold a shared_ptr to it -> ibv_dealloc_pd when the last one is gone.
#pragma once

#include <memory>

#include "transport/rdma/verbs_context.h"

namespace rdmaxfer {

class ProtectionDomain {
 public:
  explicit ProtectionDomain(std::shared_ptr<DeviceContext> context);
  ~ProtectionDomain();
  ProtectionDomain(const ProtectionDomain&) = delete;
  ProtectionDomain& operator=(const ProtectionDomain&) = delete;

  ibv_pd* get() const { return pd_; }
  const DeviceContext& context() const { return *context_; }
  const std::shared_ptr<DeviceContext>& context_ptr() const { return context_; }

 private:
  std::shared_ptr<DeviceContext> context_;
  ibv_pd* pd_ = nullptr;
};

}  // namespace rdmaxfer
