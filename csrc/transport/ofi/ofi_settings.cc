#include "transport/ofi/ofi_settings.h"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstdlib>
#include <cstring>

namespace rdmaxfer {

namespace {

char* dup_string(const std::string& s) {
  // fi_freeinfo frees these strings with free().
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) throw Error(ErrorKind::kTransport, "fi_getinfo hints: out of memory");
  std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

bool in_list(const std::string& list, const std::string& name) {
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = list.find(';', start);
    if (list.substr(start, end == std::string::npos ? std::string::npos : end - start) == name) {
      return true;
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return false;
}

}  // namespace

OfiInfo make_hints(const std::string& provider, const std::string& domain, bool delivery_complete,
                   bool hmem) {
  OfiInfo hints(ofi().dupinfo(nullptr));  // fi_allocinfo
  if (hints.get() == nullptr) throw Error(ErrorKind::kTransport, "fi_allocinfo: out of memory");
  hints->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->av_type = FI_AV_TABLE;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                                FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->data_progress = FI_PROGRESS_UNSPEC;
  hints->domain_attr->control_progress = FI_PROGRESS_UNSPEC;
  if (delivery_complete) hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  if (hmem) {
    hints->caps |= FI_HMEM;
    hints->domain_attr->mr_mode |= FI_MR_HMEM;
  }
  if (!provider.empty()) hints->fabric_attr->prov_name = dup_string(provider);
  if (!domain.empty()) hints->domain_attr->name = dup_string(domain);
  return hints;
}

bool emulated_provider(const std::string& provider) {
  for (const char* name : {"tcp", "udp", "sockets", "shm", "net"}) {
    if (in_list(provider, name)) return true;
  }
  return false;
}

OfiSettings decide_settings(const fi_info& info) {
  OfiSettings s;
  s.provider = info.fabric_attr != nullptr && info.fabric_attr->prov_name != nullptr
                   ? info.fabric_attr->prov_name
                   : "";
  s.fabric = info.fabric_attr != nullptr && info.fabric_attr->name != nullptr
                 ? info.fabric_attr->name
                 : "";
  const fi_domain_attr* d = info.domain_attr;
  s.domain = d != nullptr && d->name != nullptr ? d->name : "";
  const int mode = d != nullptr ? d->mr_mode : 0;
  s.mr_prov_key = (mode & FI_MR_PROV_KEY) != 0;
  s.mr_virt_addr = (mode & FI_MR_VIRT_ADDR) != 0;
  s.mr_local = (mode & FI_MR_LOCAL) != 0;
  s.mr_endpoint = (mode & FI_MR_ENDPOINT) != 0;
  s.mr_allocated = (mode & FI_MR_ALLOCATED) != 0;
  s.mr_hmem = (mode & FI_MR_HMEM) != 0;
  s.hmem = (info.caps & FI_HMEM) != 0;
  s.cq_data_size = d != nullptr ? d->cq_data_size : 0;
  s.mr_key_size = d != nullptr ? d->mr_key_size : 0;
  s.max_msg_size = info.ep_attr != nullptr ? info.ep_attr->max_msg_size : 0;
  s.inject_size = info.tx_attr != nullptr ? info.tx_attr->inject_size : 0;
  s.delivery_complete =
      info.tx_attr != nullptr && (info.tx_attr->op_flags & FI_DELIVERY_COMPLETE) != 0;
  s.efa = in_list(s.provider, "efa");
  s.rdma_fabric = !emulated_provider(s.provider);
  const uint64_t needed = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  if (info.ep_attr == nullptr || info.ep_attr->type != FI_EP_RDM) {
    s.refused = "provider " + s.provider + " offers no reliable datagram (FI_EP_RDM) endpoint";
  } else if ((info.caps & needed) != needed) {
    s.refused = "provider " + s.provider + " lacks one-sided READ/WRITE (FI_RMA)";
  } else if (s.cq_data_size < 4) {
    s.refused = "provider " + s.provider + " carries " + std::to_string(s.cq_data_size) +
                " bytes of remote CQ data; notifications need 4";
  } else if (s.mr_key_size < 4 && !s.mr_prov_key) {
    s.refused = "provider " + s.provider + " has " + std::to_string(s.mr_key_size) +
                "-byte MR keys; rdmaxfer's keys are 4 bytes";
  } else if (s.max_msg_size == 0) {
    s.refused = "provider " + s.provider + " reports a max_msg_size of 0";
  }
  return s;
}

OfiSettings decide_settings(const OfiInfoFields& f) {
  fi_fabric_attr fabric{};
  fi_domain_attr domain{};
  fi_ep_attr ep{};
  fi_tx_attr tx{};
  fi_info info{};
  std::string provider = f.provider;
  std::string fabric_name = f.fabric;
  std::string domain_name = f.domain;
  fabric.prov_name = provider.data();
  fabric.name = fabric_name.data();
  domain.name = domain_name.data();
  domain.mr_mode = f.mr_mode;
  domain.cq_data_size = f.cq_data_size;
  domain.mr_key_size = f.mr_key_size;
  ep.type = static_cast<fi_ep_type>(f.ep_type);
  ep.max_msg_size = f.max_msg_size;
  tx.inject_size = f.inject_size;
  tx.op_flags = f.tx_op_flags;
  info.caps = f.caps;
  info.fabric_attr = &fabric;
  info.domain_attr = &domain;
  info.ep_attr = &ep;
  info.tx_attr = &tx;
  return decide_settings(info);
}

std::vector<OfiSettings> ofi_providers(bool with_emulated) {
  OfiInfo hints = make_hints("", "", false, false);
  fi_info* found = nullptr;
  const int ret = ofi().getinfo(kOfiApiVersion, nullptr, nullptr, 0, hints.get(), &found);
  std::vector<OfiSettings> out;
  if (ret != 0) return out;
  OfiInfo list(found);
  for (fi_info* info = list.get(); info != nullptr; info = info->next) {
    OfiSettings s = decide_settings(*info);
    if (with_emulated || s.rdma_fabric) out.push_back(std::move(s));
  }
  return out;
}

std::string describe_settings(const OfiSettings& s) {
  std::string mr;
  auto bit = [&mr](bool on, const char* name) {
    if (on) mr += (mr.empty() ? "" : "|") + std::string(name);
  };
  bit(s.mr_local, "FI_MR_LOCAL");
  bit(s.mr_virt_addr, "FI_MR_VIRT_ADDR");
  bit(s.mr_allocated, "FI_MR_ALLOCATED");
  bit(s.mr_prov_key, "FI_MR_PROV_KEY");
  bit(s.mr_endpoint, "FI_MR_ENDPOINT");
  bit(s.mr_hmem, "FI_MR_HMEM");
  return "provider " + s.provider + " on " + s.domain + ", MR mode " +
         (mr.empty() ? "0" : mr) + ", max message " + std::to_string(s.max_msg_size) +
         " bytes, inject " + std::to_string(s.inject_size) + " bytes, CQ data " +
         std::to_string(s.cq_data_size) + " bytes" + (s.hmem ? ", GPU memory (FI_HMEM)" : "") +
         (s.delivery_complete ? ", delivery complete" : "");
}

}  // namespace rdmaxfer
