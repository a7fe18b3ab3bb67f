// What the ofi transport asks libfabric for, and what it decides from the provider's answer.
//
// The hints (make_hints) ask for an FI_EP_RDM endpoint with FI_MSG | FI_RMA, a thread-safe
// domain, an FI_AV_TABLE address vector, FI_CONTEXT2 contexts and every MR mode bit rdmaxfer
// can honour; the provider's fi_info then says which of those it needs. decide_settings reads
// that answer (never the provider's name, except to tell EFA's extras and whether the provider
// is a real RDMA fabric) into an OfiSettings, or the reason the provider cannot carry rdmaxfer.
// The EFA provider's requirements (FI_EP_RDM only, FI_MR_PROV_KEY, no FI_ORDER_* between
// RMAs, limits from fi_info) all arrive this way: nothing here assumes an ordering.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>

#include <cstdint>
#include <string>
#include <vector>

#include "transport/ofi/ofi_api.h"

namespace rdmaxfer {

// The EFA provider's endpoint option FI_OPT_EFA_RNR_RETRY (rdma/fi_ext.h, not vendored).
constexpr int kOfiOptEfaRnrRetry = -(0xefa << 16);

struct OfiSettings {
  std::string provider;  // fabric_attr->prov_name ("tcp;ofi_rxm", "verbs;ofi_rxm", "efa")
  std::string fabric;    // fabric_attr->name
  std::string domain;    // domain_attr->name (a NIC, or an interface for tcp)
  // MR mode bits the provider requires (each honoured by the transport).
  bool mr_prov_key = false;   // keys come from fi_mr_key, not chosen by us
  bool mr_virt_addr = false;  // remote addresses are virtual addresses (else offsets)
  bool mr_local = false;      // local buffers need their MR's descriptor
  bool mr_endpoint = false;   // every MR is bound to the endpoint and enabled
  bool mr_allocated = false;  // only allocated memory may be registered (always true here)
  bool mr_hmem = false;       // device memory needs FI_HMEM registration (fi_mr_regattr)
  bool hmem = false;          // the provider registers GPU memory (FI_HMEM in caps)
  bool delivery_complete = false;  // writes complete once placed at the target
  uint64_t max_msg_size = 0;  // ep_attr->max_msg_size: the largest single RMA
  uint64_t inject_size = 0;   // tx_attr->inject_size
  size_t cq_data_size = 0;    // bytes of remote CQ data (the IMM of a notification)
  size_t mr_key_size = 0;     // bytes of an MR key
  bool efa = false;           // the efa provider: set FI_OPT_EFA_RNR_RETRY
  bool rdma_fabric = false;   // a hardware RDMA provider (not tcp/udp/sockets/shm): auto may pick it
  std::string refused;        // why this provider cannot carry rdmaxfer ("" when it can)
};

// The hints for fi_getinfo: `provider` ("" any), `domain` ("" any: the NIC or, for tcp, the
// interface name), `delivery_complete`: ask for FI_DELIVERY_COMPLETE as the default op flag;
// `hmem`: ask for FI_HMEM (GPU memory registered with the NIC) with the FI_MR_HMEM mode bit.
// The caller owns the result (OfiInfo).
OfiInfo make_hints(const std::string& provider, const std::string& domain, bool delivery_complete,
                   bool hmem);

// Reads the provider's fi_info into settings; `refused` says why it cannot be used.
OfiSettings decide_settings(const fi_info& info);

// An fi_info reduced to the fields decide_settings reads, so that the decisions can be tested
// against any provider's answer (EFA's, say) on a machine without it, or without libfabric.
struct OfiInfoFields {
  std::string provider;
  std::string fabric;
  std::string domain;
  uint64_t caps = 0;
  int ep_type = FI_EP_RDM;
  int mr_mode = 0;
  size_t cq_data_size = 0;
  size_t mr_key_size = 0;
  uint64_t max_msg_size = 0;
  uint64_t inject_size = 0;
  uint64_t tx_op_flags = 0;
};
OfiSettings decide_settings(const OfiInfoFields& fields);

// Every answer of fi_getinfo for FI_EP_RDM with RMA (any provider, any domain; `with_emulated`
// false drops tcp, udp, sockets and shm), decided. Throws Error(kUnsupported) when libfabric
// cannot be loaded; an empty list when no provider answers.
std::vector<OfiSettings> ofi_providers(bool with_emulated);

// The settings as one line ("provider tcp;ofi_rxm on lo, MR mode ..., max message ...").
std::string describe_settings(const OfiSettings& s);

// True for providers that only emulate RDMA over sockets or memory (tcp, udp, sockets, shm):
// transport="auto" never picks them.
bool emulated_provider(const std::string& provider);

}  // namespace rdmaxfer
