#include "transport/rdma/verbs_api.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "common/error.h"

namespace rdmaxfer {

namespace {

struct LoadedVerbs {
  VerbsApi api;
  std::string why;  // empty when loaded
  void* handle = nullptr;
};

template <typename Fn>
bool verbs_symbol(void* handle, const char* name, const char* version, Fn* out, std::string* why) {
  void* sym = dlvsym(handle, name, version);
  if (sym == nullptr) {
    if (why != nullptr) {
      const char* err = dlerror();
      *why = std::string("libibverbs.so.1 lacks ") + name + "@" + version + ": " +
             (err != nullptr ? err : "symbol not found");
    }
    return false;
  }
  *out = reinterpret_cast<Fn>(sym);
  return true;
}

LoadedVerbs load_verbs() {
  LoadedVerbs l;
  // RTLD_NODELETE: providers keep pointers into the library; never unload it.
  l.handle = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (l.handle == nullptr) {
    const char* err = dlerror();
    l.why = std::string("libibverbs.so.1 not found: ") + (err != nullptr ? err : "dlopen failed") +
            " (install rdma-core / libibverbs1)";
    return l;
  }
  VerbsApi& a = l.api;
  std::string* why = &l.why;
  const char* v = "IBVERBS_1.1";
  bool ok = verbs_symbol(l.handle, "ibv_get_device_list", v, &a.get_device_list, why) &&
            verbs_symbol(l.handle, "ibv_free_device_list", v, &a.free_device_list, why) &&
            verbs_symbol(l.handle, "ibv_get_device_name", v, &a.get_device_name, why) &&
            verbs_symbol(l.handle, "ibv_open_device", v, &a.open_device, why) &&
            verbs_symbol(l.handle, "ibv_close_device", v, &a.close_device, why) &&
            verbs_symbol(l.handle, "ibv_query_device", v, &a.query_device, why) &&
            verbs_symbol(l.handle, "ibv_query_port", v, &a.query_port_compat, why) &&
            verbs_symbol(l.handle, "ibv_query_gid", v, &a.query_gid, why) &&
            verbs_symbol(l.handle, "ibv_alloc_pd", v, &a.alloc_pd, why) &&
            verbs_symbol(l.handle, "ibv_dealloc_pd", v, &a.dealloc_pd, why) &&
            verbs_symbol(l.handle, "ibv_reg_mr", v, &a.reg_mr_v11, why) &&
            verbs_symbol(l.handle, "ibv_dereg_mr", v, &a.dereg_mr, why) &&
            verbs_symbol(l.handle, "ibv_create_comp_channel", "IBVERBS_1.0",
                         &a.create_comp_channel, why) &&
            verbs_symbol(l.handle, "ibv_destroy_comp_channel", "IBVERBS_1.0",
                         &a.destroy_comp_channel, why) &&
            verbs_symbol(l.handle, "ibv_create_cq", v, &a.create_cq, why) &&
            verbs_symbol(l.handle, "ibv_destroy_cq", v, &a.destroy_cq, why) &&
            verbs_symbol(l.handle, "ibv_get_cq_event", v, &a.get_cq_event, why) &&
            verbs_symbol(l.handle, "ibv_ack_cq_events", v, &a.ack_cq_events, why) &&
            verbs_symbol(l.handle, "ibv_create_qp", v, &a.create_qp, why) &&
            verbs_symbol(l.handle, "ibv_modify_qp", v, &a.modify_qp, why) &&
            verbs_symbol(l.handle, "ibv_query_qp", v, &a.query_qp, why) &&
            verbs_symbol(l.handle, "ibv_destroy_qp", v, &a.destroy_qp, why) &&
            verbs_symbol(l.handle, "ibv_create_srq", v, &a.create_srq, why) &&
            verbs_symbol(l.handle, "ibv_modify_srq", v, &a.modify_srq, why) &&
            verbs_symbol(l.handle, "ibv_destroy_srq", v, &a.destroy_srq, why) &&
            verbs_symbol(l.handle, "ibv_get_async_event", v, &a.get_async_event, why) &&
            verbs_symbol(l.handle, "ibv_ack_async_event", v, &a.ack_async_event, why) &&
            verbs_symbol(l.handle, "ibv_wc_status_str", v, &a.wc_status_str, why) &&
            verbs_symbol(l.handle, "ibv_event_type_str", v, &a.event_type_str, why);
  if (!ok) return l;
  // Optional: absent on old rdma-core; not an error.
  verbs_symbol(l.handle, "ibv_reg_mr_iova2", "IBVERBS_1.8", &a.reg_mr_iova2, nullptr);
  verbs_symbol(l.handle, "ibv_reg_dmabuf_mr", "IBVERBS_1.12", &a.reg_dmabuf_mr, nullptr);
  dlerror();
  return l;
}

const LoadedVerbs& loaded_verbs() {
  static const LoadedVerbs l = load_verbs();  // thread-safe static initialisation
  return l;
}

}  // namespace

ibv_mr* VerbsApi::reg_mr(ibv_pd* pd, void* addr, size_t length, unsigned int access) const {
  // What verbs.h's ibv_reg_mr macro does for flags without IBV_ACCESS_OPTIONAL_RANGE.
  if (reg_mr_iova2 != nullptr && (access & IBV_ACCESS_OPTIONAL_RANGE) != 0) {
    return reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr), access);
  }
  return reg_mr_v11(pd, addr, length, static_cast<int>(access));
}

int VerbsApi::query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr) const {
  // What verbs.h's inline ___ibv_query_port does: the extended op when the provider has it,
  // else the exported compat symbol (which fills the old, shorter struct layout).
  verbs_context* vctx = verbs_get_ctx_op(context, query_port);
  if (vctx == nullptr) {
    std::memset(attr, 0, sizeof(*attr));
    return query_port_compat(context, port_num, attr);
  }
  return vctx->query_port(context, port_num, attr, sizeof(*attr));
}

const VerbsApi* verbs_api(std::string* why) {
  const LoadedVerbs& l = loaded_verbs();
  if (!l.why.empty()) {
    if (why != nullptr) *why = l.why;
    return nullptr;
  }
  return &l.api;
}

const VerbsApi& verbs() {
  std::string why;
  const VerbsApi* api = verbs_api(&why);
  if (api == nullptr) throw Error(ErrorKind::kUnsupported, "rdma transport unavailable: " + why);
  return *api;
}

void throw_verbs(const std::string& op, int err) {
  if (err == 0) err = EIO;  // some providers fail without setting errno
  throw_errno(ErrorKind::kTransport, op, err);
}

std::string wc_status_name(ibv_wc_status status) {
  static const char* const kNames[] = {
      "IBV_WC_SUCCESS",          "IBV_WC_LOC_LEN_ERR",       "IBV_WC_LOC_QP_OP_ERR",
      "IBV_WC_LOC_EEC_OP_ERR",   "IBV_WC_LOC_PROT_ERR",      "IBV_WC_WR_FLUSH_ERR",
      "IBV_WC_MW_BIND_ERR",      "IBV_WC_BAD_RESP_ERR",      "IBV_WC_LOC_ACCESS_ERR",
      "IBV_WC_REM_INV_REQ_ERR",  "IBV_WC_REM_ACCESS_ERR",    "IBV_WC_REM_OP_ERR",
      "IBV_WC_RETRY_EXC_ERR",    "IBV_WC_RNR_RETRY_EXC_ERR", "IBV_WC_LOC_RDD_VIOL_ERR",
      "IBV_WC_REM_INV_RD_REQ_ERR", "IBV_WC_REM_ABORT_ERR",   "IBV_WC_INV_EECN_ERR",
      "IBV_WC_INV_EEC_STATE_ERR", "IBV_WC_FATAL_ERR",        "IBV_WC_RESP_TIMEOUT_ERR",
      "IBV_WC_GENERAL_ERR",
  };
  const unsigned idx = static_cast<unsigned>(status);
  return idx < sizeof(kNames) / sizeof(kNames[0]) ? kNames[idx]
                                                  : "status " + std::to_string(idx);
}

std::string wc_status_text(ibv_wc_status status) {
  const VerbsApi* api = verbs_api(nullptr);
  std::string text = api != nullptr ? api->wc_status_str(status) : "completion error";
  return text + " (" + wc_status_name(status) + ", wc_status " +
         std::to_string(static_cast<int>(status)) + ")";
}

CompletionStatus completion_status(const ibv_wc& wc) {
  return CompletionStatus{static_cast<int>(wc.status), wc_status_name(wc.status), wc.vendor_err};
}

}  // namespace rdmaxfer
