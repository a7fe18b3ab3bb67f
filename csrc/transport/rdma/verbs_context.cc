#include "transport/rdma/verbs_context.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "common/error.h"
#include "transport/rdma/endpoint_record.h"
#include "transport/rdma/rdma_config.h"

namespace rdmaxfer {

namespace {

// The device list, freed on scope exit.
class DeviceList {
 public:
  explicit DeviceList(const VerbsApi& api) : api_(api) {
    list_ = api_.get_device_list(&count_);
    if (list_ == nullptr) {
      const int e = errno;
      if (e == ENOSYS || e == 0) count_ = 0;  // no RDMA subsystem at all: an empty list
      else throw_verbs("ibv_get_device_list", e);
    }
  }
  ~DeviceList() {
    if (list_ != nullptr) api_.free_device_list(list_);
  }
  DeviceList(const DeviceList&) = delete;
  DeviceList& operator=(const DeviceList&) = delete;
  int size() const { return count_; }
  ibv_device* operator[](int i) const { return list_[i]; }

 private:
  const VerbsApi& api_;
  ibv_device** list_ = nullptr;
  int count_ = 0;
};

std::string read_sysfs_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

bool gid_is_zero(const ibv_gid& g) {
  for (uint8_t b : g.raw) {
    if (b != 0) return false;
  }
  return true;
}

// First active port of an open context (0 when none).
uint8_t first_active_port(const VerbsApi& api, ibv_context* ctx, const ibv_device_attr& attr) {
  for (uint8_t p = 1; p <= attr.phys_port_cnt; ++p) {
    ibv_port_attr pa{};
    if (api.query_port(ctx, p, &pa) == 0 && pa.state == IBV_PORT_ACTIVE) return p;
  }
  return 0;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < 0 || x > 65535) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(name) + "=" + v + " is not a non-negative integer");
  }
  return static_cast<int>(x);
}

}  // namespace

int mtu_bytes(int mtu_enum) {
  return mtu_enum >= IBV_MTU_256 && mtu_enum <= IBV_MTU_4096 ? 128 << mtu_enum : 0;
}

std::shared_ptr<DeviceContext> DeviceContext::open(const std::string& device_in, int port,
                                                   int gid_index) {
  const VerbsApi& api = verbs();
  std::string device = device_in;
  if (device.empty()) {
    const char* env = std::getenv("RDMAXFER_RDMA_DEVICE");
    if (env != nullptr) device = env;
  }
  if (gid_index < 0) gid_index = env_int("RDMAXFER_GID_INDEX", -1);

  DeviceList list(api);
  if (list.size() == 0) {
    throw Error(ErrorKind::kUnsupported,
                "no RDMA device with an active port (ibv_get_device_list found no device; is an "
                "RDMA driver loaded? for soft-RoCE: rdma link add rxe0 type rxe netdev <if>)");
  }
  std::shared_ptr<DeviceContext> dc(new DeviceContext());
  std::string names;
  std::string no_rc;  // devices without RC queue pairs
  for (int i = 0; i < list.size(); ++i) {
    const std::string name = api.get_device_name(list[i]);
    names += (names.empty() ? "" : ", ") + name;
    if (!device.empty() && name != device) continue;
    const ibv_transport_type type = list[i]->transport_type;
    if (type != IBV_TRANSPORT_IB && type != IBV_TRANSPORT_IWARP) {
      // EFA's verbs device, say: SRD and UD queue pairs only.
      no_rc += (no_rc.empty() ? "" : ", ") + name;
      if (!device.empty()) {
        throw Error(ErrorKind::kUnsupported,
                    "RDMA device " + name + " offers no RC queue pairs (verbs transport type " +
                        std::to_string(static_cast<int>(type)) +
                        "); use transport='ofi' (libfabric's provider for it, efa on EFA)");
      }
      continue;
    }
    ibv_context* ctx = api.open_device(list[i]);
    if (ctx == nullptr) {
      if (!device.empty()) throw_verbs("ibv_open_device(" + name + ")", errno);
      continue;
    }
    ibv_device_attr attr{};
    int rc = api.query_device(ctx, &attr);
    if (rc != 0) {
      api.close_device(ctx);
      throw_verbs("ibv_query_device(" + name + ")", rc);
    }
    uint8_t p = port > 0 ? static_cast<uint8_t>(port) : first_active_port(api, ctx, attr);
    if (p == 0) {
      api.close_device(ctx);
      if (!device.empty()) {
        throw Error(ErrorKind::kUnsupported, "RDMA device " + name + " has no active port");
      }
      continue;
    }
    dc->ctx_ = ctx;
    dc->name_ = name;
    dc->port_ = p;
    dc->device_attr_ = attr;
    break;
  }
  if (dc->ctx_ == nullptr) {
    if (!device.empty()) {
      throw Error(ErrorKind::kUnsupported,
                  "no RDMA device named '" + device + "' (found: " + names + ")");
    }
    throw Error(ErrorKind::kUnsupported,
                "no RDMA device with an active port and RC queue pairs (found: " + names +
                    (no_rc.empty() ? std::string() : "; without RC: " + no_rc) + ")");
  }
  int rc = api.query_port(dc->ctx_, dc->port_, &dc->port_attr_);
  if (rc != 0) throw_verbs("ibv_query_port(" + dc->name_ + ")", rc);
  if (dc->port_attr_.state != IBV_PORT_ACTIVE) {
    throw Error(ErrorKind::kUnsupported, "port " + std::to_string(dc->port_) + " of " +
                                             dc->name_ + " is not active");
  }

  const int table = dc->port_attr_.gid_tbl_len;
  if (gid_index >= 0) {
    if (gid_index >= table) {
      throw Error(ErrorKind::kInvalidArgument,
                  "gid_index=" + std::to_string(gid_index) + " is outside the GID table of " +
                      dc->name_ + " port " + std::to_string(dc->port_) + " (" +
                      std::to_string(table) + " entries)");
    }
    dc->gid_index_ = gid_index;
    dc->gid_choice_ = "explicit";
  } else if (!dc->ethernet()) {
    dc->gid_index_ = 0;
    dc->gid_choice_ = "auto: InfiniBand, addressed by LID";
  } else {
    // Ranked: RoCE v2 + IPv4-mapped (3) > RoCE v2 (2) > any non-zero (1).
    int best = -1;
    int best_rank = 0;
    const std::string base = "/sys/class/infiniband/" + dc->name_ + "/ports/" +
                             std::to_string(dc->port_) + "/gid_attrs/types/";
    for (int i = 0; i < table && best_rank < 3; ++i) {
      ibv_gid g{};
      if (api.query_gid(dc->ctx_, dc->port_, i, &g) != 0 || gid_is_zero(g)) continue;
      const bool v2 = read_sysfs_line(base + std::to_string(i)) == "RoCE v2";
      const int rank = v2 ? (gid_is_ipv4(g.raw) ? 3 : 2) : 1;
      if (rank > best_rank) {
        best = i;
        best_rank = rank;
      }
    }
    dc->gid_index_ = best < 0 ? 0 : best;
    dc->gid_choice_ = best_rank == 3   ? "auto: RoCE v2, IPv4-mapped"
                      : best_rank == 2 ? "auto: RoCE v2"
                      : best_rank == 1 ? "auto: first non-zero GID"
                                       : "auto: none found, index 0";
  }
  rc = api.query_gid(dc->ctx_, dc->port_, dc->gid_index_, &dc->gid_);
  if (rc != 0) throw_verbs("ibv_query_gid(" + std::to_string(dc->gid_index_) + ")", rc);
  if (dc->ethernet() && gid_is_zero(dc->gid_)) {
    throw Error(ErrorKind::kUnsupported,
                "GID index " + std::to_string(dc->gid_index_) + " of " + dc->name_ +
                    " is empty (no IP address on the netdev?); pick another gid_index");
  }
  return dc;
}

std::vector<std::string> DeviceContext::active_devices() {
  const VerbsApi& api = verbs();
  DeviceList list(api);
  std::vector<std::string> out;
  for (int i = 0; i < list.size(); ++i) {
    ibv_context* ctx = api.open_device(list[i]);
    if (ctx == nullptr) continue;
    ibv_device_attr attr{};
    if (api.query_device(ctx, &attr) == 0 && first_active_port(api, ctx, attr) != 0) {
      out.emplace_back(api.get_device_name(list[i]));
    }
    api.close_device(ctx);
  }
  return out;
}

std::vector<std::string> DeviceContext::listed_devices() {
  const VerbsApi& api = verbs();
  DeviceList list(api);
  std::vector<std::string> out;
  for (int i = 0; i < list.size(); ++i) out.emplace_back(api.get_device_name(list[i]));
  return out;
}

DeviceContext::~DeviceContext() {
  if (ctx_ != nullptr) verbs().close_device(ctx_);
}

std::string DeviceContext::port_not_active() const {
  ibv_port_attr now{};
  const int rc = verbs().query_port(ctx_, port_, &now);
  const std::string port = "port " + std::to_string(port_) + " of " + name_;
  if (rc != 0) return port + " cannot be queried: " + errno_text("ibv_query_port", rc);
  switch (now.state) {
    case IBV_PORT_ACTIVE: return "";
    case IBV_PORT_DOWN: return port + " is DOWN";
    case IBV_PORT_INIT: return port + " is INIT";
    case IBV_PORT_ARMED: return port + " is ARMED";
    case IBV_PORT_ACTIVE_DEFER: return port + " is ACTIVE_DEFER";
    default: return port + " is in state " + std::to_string(now.state);
  }
}

std::string DeviceContext::gid_text() const {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (inet_ntop(AF_INET6, gid_.raw, buf, sizeof(buf)) == nullptr) return "?";
  return buf;
}

std::string rdma_unavailable_reason() {
  std::string why;
  if (verbs_api(&why) == nullptr) return why;
  try {
    auto dc = DeviceContext::open("", 0, -1);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace rdmaxfer
