// What the verbs transport offers beside its registration (rdma_registration.cc).
#pragma once

#include <string>

namespace rdmaxfer {

// "" when this libibverbs can register dmabuf memory (ibv_reg_dmabuf_mr), else why not.
std::string verbs_dmabuf_unavailable();

}  // namespace rdmaxfer
