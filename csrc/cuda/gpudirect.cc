#include "cuda/gpudirect.h"

#include <cerrno>

#include "common/error.h"
#include "core/region.h"

namespace rdmaxfer {

const char* gpu_registration_name(GpuRegistration method) {
  return method == GpuRegistration::kDmabuf ? "dmabuf" : "nvidia-peermem";
}

std::string gpu_registration_error(GpuRegistration method, uint64_t length, int err_no) {
  const bool dmabuf = method == GpuRegistration::kDmabuf;
  std::string text = errno_text(std::string(dmabuf ? "ibv_reg_dmabuf_mr" : "ibv_reg_mr") +
                                    " of " + std::to_string(length) + " bytes of GPU memory",
                                err_no);
  switch (err_no) {
    case EFAULT:
      text += dmabuf ? "; the HCA driver could not map the GPU pages through dmabuf: use the "
                       "open NVIDIA kernel modules (nvidia-open) and a kernel >= 5.12, or load "
                       "nvidia-peermem (modprobe nvidia-peermem)"
                     : "; the HCA driver cannot pin GPU memory: load the nvidia-peermem kernel "
                       "module (modprobe nvidia-peermem), or use dmabuf (open NVIDIA kernel "
                       "modules); rdmaxfer falls back to staging through host memory otherwise";
      break;
    case EOPNOTSUPP:
    case EPROTONOSUPPORT:
    case EINVAL:
      text += dmabuf ? "; this NIC driver or kernel does not support dmabuf memory regions: "
                       "needs kernel >= 5.12 and an HCA driver with dmabuf (mlx5); or load "
                       "nvidia-peermem"
                     : "; this device cannot register GPU memory by address: load "
                       "nvidia-peermem, or use dmabuf (open NVIDIA kernel modules)";
      break;
    case ENOMEM:
    case EAGAIN:
    case EPERM:
      text += "; the locked-memory limit (ulimit -l) is " + memlock_limit_text() +
              ": raise it (ulimit -l unlimited, memlock in /etc/security/limits.conf, or "
              "--ulimit memlock=-1 for containers); GPU BAR space may also be exhausted";
      break;
    default:
      text += "; GPU memory goes through staging (host bounce buffers) instead";
      break;
  }
  return text;
}

}  // namespace rdmaxfer
