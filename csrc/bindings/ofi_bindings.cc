#include "bindings/ofi_bindings.h"

#include <pybind11/stl.h>

#include <string>

#include "bindings/gil.h"
#include "transport/ofi/ofi_settings.h"

namespace py = pybind11;

namespace rdmaxfer {

namespace {

py::dict settings_dict(const OfiSettings& s) {
  py::dict d;
  d["provider"] = s.provider;
  d["fabric"] = s.fabric;
  d["domain"] = s.domain;
  d["mr_prov_key"] = s.mr_prov_key;
  d["mr_virt_addr"] = s.mr_virt_addr;
  d["mr_local"] = s.mr_local;
  d["mr_endpoint"] = s.mr_endpoint;
  d["mr_allocated"] = s.mr_allocated;
  d["mr_hmem"] = s.mr_hmem;
  d["hmem"] = s.hmem;
  d["delivery_complete"] = s.delivery_complete;
  d["max_msg_size"] = s.max_msg_size;
  d["inject_size"] = s.inject_size;
  d["cq_data_size"] = s.cq_data_size;
  d["mr_key_size"] = s.mr_key_size;
  d["efa"] = s.efa;
  d["rdma_fabric"] = s.rdma_fabric;
  d["refused"] = s.refused;
  d["summary"] = describe_settings(s);
  return d;
}

}  // namespace

void bind_ofi(py::module_& m) {
  m.def(
      "ofi_providers",
      [](bool with_emulated) {
        std::vector<OfiSettings> found;
        {
          GilRelease release;
          found = ofi_providers(with_emulated);
        }
        py::list out;
        for (const OfiSettings& s : found) out.append(settings_dict(s));
        return out;
      },
      py::arg("with_emulated") = false,
      "Every libfabric provider and domain offering FI_EP_RDM with RMA, as the ofi transport "
      "decides it (a dict each; 'refused' says why one cannot carry rdmaxfer). Raises "
      "UnsupportedError when libfabric cannot be loaded.");
  m.def(
      "ofi_decide_settings",
      [](const std::string& provider, const std::string& domain, uint64_t caps, int ep_type,
         int mr_mode, size_t cq_data_size, size_t mr_key_size, uint64_t max_msg_size,
         uint64_t inject_size, uint64_t tx_op_flags) {
        OfiInfoFields f;
        f.provider = provider;
        f.domain = domain;
        f.caps = caps;
        f.ep_type = ep_type;
        f.mr_mode = mr_mode;
        f.cq_data_size = cq_data_size;
        f.mr_key_size = mr_key_size;
        f.max_msg_size = max_msg_size;
        f.inject_size = inject_size;
        f.tx_op_flags = tx_op_flags;
        return settings_dict(decide_settings(f));
      },
      py::arg("provider"), py::arg("domain") = "", py::arg("caps") = 0,
      py::arg("ep_type") = static_cast<int>(FI_EP_RDM), py::arg("mr_mode") = 0,
      py::arg("cq_data_size") = 0, py::arg("mr_key_size") = 0, py::arg("max_msg_size") = 0,
      py::arg("inject_size") = 0, py::arg("tx_op_flags") = 0,
      "What the ofi transport decides from an fi_info with these fields (libfabric's FI_* "
      "values; no libfabric needed): the same dict as ofi_providers().");
  py::dict bits;
  bits["FI_MSG"] = FI_MSG;
  bits["FI_RMA"] = FI_RMA;
  bits["FI_READ"] = FI_READ;
  bits["FI_WRITE"] = FI_WRITE;
  bits["FI_REMOTE_READ"] = FI_REMOTE_READ;
  bits["FI_REMOTE_WRITE"] = FI_REMOTE_WRITE;
  bits["FI_HMEM"] = FI_HMEM;
  bits["FI_EP_RDM"] = static_cast<int>(FI_EP_RDM);
  bits["FI_EP_MSG"] = static_cast<int>(FI_EP_MSG);
  bits["FI_MR_LOCAL"] = FI_MR_LOCAL;
  bits["FI_MR_VIRT_ADDR"] = FI_MR_VIRT_ADDR;
  bits["FI_MR_ALLOCATED"] = FI_MR_ALLOCATED;
  bits["FI_MR_PROV_KEY"] = FI_MR_PROV_KEY;
  bits["FI_MR_ENDPOINT"] = FI_MR_ENDPOINT;
  bits["FI_MR_HMEM"] = FI_MR_HMEM;
  bits["FI_DELIVERY_COMPLETE"] = FI_DELIVERY_COMPLETE;
  m.attr("OFI_BITS") = bits;
}

}  // namespace rdmaxfer
