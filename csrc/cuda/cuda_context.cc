#include "cuda/cuda_context.h"

#include <cctype>
#include <map>
#include <mutex>

#include "common/error.h"
#include "cuda/cuda_api.h"

namespace rdmaxfer {

namespace {

int device_count() {
  int n = 0;
  check_cuda(cuda().device_get_count(&n), "cuDeviceGetCount");
  return n;
}

int attribute(CUdevice dev, int attr) {
  int value = 0;
  if (cuda().device_get_attribute(&value, attr, dev) != kCudaSuccess) return 0;
  return value;
}

}  // namespace

CudaContext::CudaContext(int ordinal) : ordinal_(ordinal) {
  const CudaApi& api = cuda();
  const int n = device_count();
  if (ordinal < 0 || ordinal >= n) {
    throw Error(ErrorKind::kInvalidArgument,
                "cuda:" + std::to_string(ordinal) + " does not exist: this machine has " +
                    std::to_string(n) + " GPU(s) (cuda:0..cuda:" + std::to_string(n - 1) + ")");
  }
  check_cuda(api.device_get(&device_, ordinal), "cuDeviceGet");
  check_cuda(api.primary_ctx_retain(&ctx_, device_), "cuDevicePrimaryCtxRetain");
}

CudaContext::~CudaContext() {
  if (ctx_ != nullptr) cuda().primary_ctx_release(device_);
}

std::shared_ptr<CudaContext> CudaContext::get(int ordinal) {
  static std::mutex mu;
  static std::map<int, std::shared_ptr<CudaContext>>* contexts =
      new std::map<int, std::shared_ptr<CudaContext>>();  // never freed: outlives exit-time users
  std::lock_guard<std::mutex> lock(mu);
  auto it = contexts->find(ordinal);
  if (it != contexts->end()) return it->second;
  auto ctx = std::make_shared<CudaContext>(ordinal);
  (*contexts)[ordinal] = ctx;
  return ctx;
}

void CudaContext::bind() const { check_cuda(cuda().ctx_set_current(ctx_), "cuCtxSetCurrent"); }

CudaStatus cuda_status() {
  CudaStatus s;
  const CudaApi* api = cuda_api(&s.unavailable);
  if (api == nullptr) return s;
  try {
    check_cuda(api->driver_get_version(&s.driver_version), "cuDriverGetVersion");
    s.get_handle_for_address_range = api->mem_get_handle_for_address_range != nullptr;
    s.cuda_ipc = cuda_ipc_unavailable(*api);
    s.can_access_peer = api->device_can_access_peer != nullptr;
    const int n = device_count();
    for (int i = 0; i < n; ++i) {
      GpuInfo g;
      g.ordinal = i;
      CUdevice dev = 0;
      check_cuda(api->device_get(&dev, i), "cuDeviceGet");
      char name[256] = {};
      check_cuda(api->device_get_name(name, sizeof(name) - 1, dev), "cuDeviceGetName");
      g.name = name;
      char bus[64] = {};
      check_cuda(api->device_get_pci_bus_id(bus, sizeof(bus) - 1, dev), "cuDeviceGetPCIBusId");
      g.pci_bus_id = bus;
      for (char& c : g.pci_bus_id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t total = 0;
      check_cuda(api->device_total_mem(&total, dev), "cuDeviceTotalMem");
      g.total_memory = total;
      g.cc_major = attribute(dev, kAttrComputeCapabilityMajor);
      g.cc_minor = attribute(dev, kAttrComputeCapabilityMinor);
      g.gpu_direct_rdma = attribute(dev, kAttrGpuDirectRdmaSupported) != 0;
      g.dma_buf = attribute(dev, kAttrDmaBufSupported) != 0;
      for (int j = 0; j < n && s.can_access_peer; ++j) {
        CUdevice peer = 0;
        int can = 0;
        if (j == i) continue;
        check_cuda(api->device_get(&peer, j), "cuDeviceGet");
        check_cuda(api->device_can_access_peer(&can, dev, peer), "cuDeviceCanAccessPeer");
        if (can != 0) g.peers.push_back(j);
      }
      s.gpus.push_back(g);
    }
  } catch (const Error& e) {
    s.unavailable = std::string("CUDA driver present but unusable: ") + e.what();
  }
  return s;
}

}  // namespace rdmaxfer
