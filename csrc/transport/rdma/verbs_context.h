// One opened RDMA device and the port/GID this engine uses on it.
//
// Lifecycle: open() picks the device (by name, or the first with an active port), the port and
// the GID index, queries their attributes and opens the context -> the PD, CQs and QPs made on it
// hold a shared_ptr, so it stays open until the last of them is gone -> ibv_close_device.
//
// GID choice (Ethernet link layer, RoCE): an explicit index wins (gid_index= or
// RDMAXFER_GID_INDEX). Otherwise the first index whose type in
// /sys/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<i> is "RoCE v2" and whose GID is an
// IPv4-mapped address (::ffff:a.b.c.d): it routes over IPv4 like the bootstrap does. If there is
// none, the first non-zero RoCE v2 GID, then the first non-zero GID, then index 0. On an
// InfiniBand link layer the LID addresses the port (no GRH) and the GID is informational.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/rdma/verbs_api.h"

namespace rdmaxfer {

class DeviceContext {
 public:
  // Throws Error(kUnsupported) when no such device / no active port, kTransport on verbs errors.
  static std::shared_ptr<DeviceContext> open(const std::string& device, int port, int gid_index);
  // Every device with an active port, in ibv_get_device_list order.
  static std::vector<std::string> active_devices();
  // The names ibv_get_device_list gives now (no device opened). rdma-core lists devices from
  // RDMA netlink, which stops listing one as soon as the kernel begins unregistering it (a
  // `rdma link delete`, a driver unbind), while contexts opened on it still work: that is how
  // an engine notices a device being removed (rdma_transport.h). Throws Error(kTransport)
  // when the listing fails.
  static std::vector<std::string> listed_devices();
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  ibv_context* get() const { return ctx_; }
  const std::string& name() const { return name_; }
  uint8_t port() const { return port_; }
  const ibv_port_attr& port_attr() const { return port_attr_; }
  const ibv_device_attr& device_attr() const { return device_attr_; }
  bool ethernet() const { return port_attr_.link_layer == IBV_LINK_LAYER_ETHERNET; }
  int gid_index() const { return gid_index_; }
  const ibv_gid& gid() const { return gid_; }
  std::string gid_text() const;
  // The port's state asked of the device now: "" when ACTIVE, else why not, e.g. "port 1 of
  // rxe0 is DOWN" (also when ibv_query_port itself fails).
  std::string port_not_active() const;
  const std::string& gid_choice() const { return gid_choice_; }

 private:
  DeviceContext() = default;
  ibv_context* ctx_ = nullptr;
  std::string name_;
  uint8_t port_ = 1;
  ibv_port_attr port_attr_{};
  ibv_device_attr device_attr_{};
  int gid_index_ = 0;
  ibv_gid gid_{};
  std::string gid_choice_;
};

// "256", "512" ... "4096" for an ibv_mtu value.
int mtu_bytes(int mtu_enum);

}  // namespace rdmaxfer
