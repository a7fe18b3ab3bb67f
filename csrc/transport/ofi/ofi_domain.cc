#include "transport/ofi/ofi_domain.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "common/log.h"

namespace rdmaxfer {

namespace {

constexpr int kCqBatch = 64;
constexpr int kSreadTimeoutMs = 200;  // the completion thread's bound between stop checks
// The longest a post waits while the provider answers FI_EAGAIN: its queue full with nothing
// completing, or its connection to the peer not set up (ofi_rxm sets it up on first use).
constexpr double kPostStallS = 30.0;

uint64_t mr_access(uint32_t access) {
  // Local: a source of WRITEs and SENDs always; a destination of READs and RECVs only with the
  // local write right (so read-only memory registers). Remote rights as asked.
  uint64_t a = FI_WRITE | FI_SEND;
  if ((access & kAccessLocalWrite) != 0) a |= FI_READ | FI_RECV;
  if ((access & kAccessRemoteRead) != 0) a |= FI_REMOTE_READ;
  if ((access & kAccessRemoteWrite) != 0) a |= FI_REMOTE_WRITE;
  return a;
}

}  // namespace

OfiRegion::OfiRegion(uint8_t* addr, uint64_t length, uint32_t access,
                     std::unique_ptr<PinnedAllocation> owned, std::vector<RailMr> mrs)
    : MemoryRegion(addr, length, access, std::move(owned)), mrs_(std::move(mrs)) {
  if (!mrs_.empty()) set_key(mrs_.front().key);
}

void* OfiRegion::desc(size_t rail) const {
  return rail < mrs_.size() && mrs_[rail].mr.get() != nullptr ? fi_mr_desc(mrs_[rail].mr.get())
                                                              : nullptr;
}

std::vector<uint32_t> OfiRegion::rail_keys() const {
  std::vector<uint32_t> keys;
  for (size_t i = 1; i < mrs_.size(); ++i) keys.push_back(mrs_[i].key);
  return keys;
}

namespace {

// The first answer of fi_getinfo that decide_settings accepts (with `provider` unset, the
// first hardware RDMA provider: tcp, udp, sockets and shm are taken only when named).
// `ask_delivery`: ask for FI_DELIVERY_COMPLETE first; `ask_hmem`: ask for FI_HMEM first.
std::pair<OfiInfo, OfiSettings> select_provider(const std::string& provider,
                                                const std::string& domain, bool ask_delivery,
                                                bool ask_hmem) {
  const OfiApi& api = ofi();
  fi_info* found = nullptr;
  // GPU memory registered with the NIC where the provider offers it (else it is staged), and
  // writes that complete once placed at the target where the provider offers that; else its
  // default (reliable providers complete a WRITE once the target acknowledged it).
  int ret = -FI_ENODATA;
  bool delivery_complete = false;  // the provider took FI_DELIVERY_COMPLETE as a default flag
  for (bool hmem : {true, false}) {
    if (hmem && !ask_hmem) continue;
    for (bool delivery : {true, false}) {
      if (delivery && !ask_delivery) continue;
      OfiInfo hints = make_hints(provider, domain, delivery, hmem);
      ret = api.getinfo(kOfiApiVersion, nullptr, nullptr, 0, hints.get(), &found);
      if (ret == 0) {
        delivery_complete = delivery;
        break;
      }
    }
    if (ret == 0) break;
  }
  const std::string asked = (provider.empty() ? std::string("any provider") : provider) +
                            (domain.empty() ? "" : " on " + domain);
  if (ret != 0) {
    throw Error(ErrorKind::kUnsupported,
                ofi_error_text("fi_getinfo (" + asked + ", FI_EP_RDM with FI_RMA)", ret));
  }
  OfiInfo list(found);
  std::string refusals;
  std::string others;  // the domains listed besides the one asked for
  for (fi_info* info = list.get(); info != nullptr; info = info->next) {
    OfiSettings s = decide_settings(*info);
    // A utility provider (ofi_rxm) answers for every domain of its core provider whatever the
    // hints name: keep the one asked for.
    if (!domain.empty() && s.domain != domain) {
      if (others.find(s.domain) == std::string::npos) {
        others += (others.empty() ? "" : ", ") + s.domain;
      }
      continue;
    }
    s.delivery_complete = s.delivery_complete || delivery_complete;
    if (s.refused.empty() && provider.empty() && !s.rdma_fabric) {
      s.refused = s.provider + " emulates RDMA (name it in RDMAXFER_OFI_PROVIDER to use it)";
    }
    if (!s.refused.empty()) {
      if (refusals.find(s.refused) == std::string::npos) {
        refusals += (refusals.empty() ? "" : "; ") + s.refused;
      }
      continue;
    }
    OfiInfo chosen(api.dupinfo(info));
    if (chosen.get() == nullptr) throw Error(ErrorKind::kTransport, "fi_dupinfo: out of memory");
    return {std::move(chosen), std::move(s)};
  }
  if (refusals.empty()) refusals = "no domain of that name (listed: " + others + ")";
  throw Error(ErrorKind::kUnsupported, "no libfabric provider usable for " + asked + ": " +
                                           refusals);
}

}  // namespace

std::vector<std::string> OfiDomain::domains(const std::string& provider) {
  const OfiApi& api = ofi();
  OfiInfo hints = make_hints(provider, "", false, false);
  fi_info* found = nullptr;
  const int ret = api.getinfo(kOfiApiVersion, nullptr, nullptr, 0, hints.get(), &found);
  const std::string asked = provider.empty() ? std::string("any provider") : provider;
  if (ret != 0) {
    throw Error(ErrorKind::kUnsupported,
                ofi_error_text("fi_getinfo (" + asked + ", FI_EP_RDM with FI_RMA)", ret));
  }
  OfiInfo list(found);
  std::string chosen;  // the provider of the first usable answer: every rail takes it
  std::vector<std::string> names;
  for (fi_info* info = list.get(); info != nullptr; info = info->next) {
    const OfiSettings s = decide_settings(*info);
    if (!s.refused.empty() || (provider.empty() && !s.rdma_fabric)) continue;
    if (chosen.empty()) chosen = s.provider;
    if (s.provider != chosen) continue;
    if (std::find(names.begin(), names.end(), s.domain) == names.end()) names.push_back(s.domain);
  }
  if (names.empty()) {
    throw Error(ErrorKind::kUnsupported, "no libfabric domain usable for " + asked +
                                             " (FI_EP_RDM with FI_RMA): 'auto' found no NIC");
  }
  return names;
}

std::shared_ptr<OfiDomain> OfiDomain::open(const std::string& provider,
                                           const std::string& domain, PollMode poll_mode,
                                           bool ask_hmem) {
  auto [info, settings] = select_provider(provider, domain, true, ask_hmem);
  if (!settings.delivery_complete) {
    return std::shared_ptr<OfiDomain>(
        new OfiDomain(std::move(info), std::move(settings), poll_mode));
  }
  try {
    return std::shared_ptr<OfiDomain>(
        new OfiDomain(std::move(info), std::move(settings), poll_mode));
  } catch (const Error& e) {
    // A provider that lists FI_DELIVERY_COMPLETE but cannot open an endpoint with it: its
    // default completions instead. (verbs;ofi_rxm's EINVAL from fi_enable on rxe was its MSG
    // completion queue, larger than the device's max_cqe: FI_UNIVERSE_SIZE, ofi_api.cc.)
    log::write(log::Level::kDebug, std::string("ofi: without FI_DELIVERY_COMPLETE after ") +
                                       e.what());
    auto [plain, plain_settings] = select_provider(provider, domain, false, ask_hmem);
    return std::shared_ptr<OfiDomain>(
        new OfiDomain(std::move(plain), std::move(plain_settings), poll_mode));
  }
}

OfiSettings OfiDomain::probe(const std::string& provider, const std::string& domain) {
  return select_provider(provider, domain, true, false).second;
}

OfiDomain::OfiDomain(OfiInfo info, OfiSettings settings, PollMode poll_mode)
    : info_(std::move(info)), settings_(std::move(settings)), poll_mode_(poll_mode) {
  int ret = ofi().fabric(info_->fabric_attr, fabric_.out(), nullptr);
  if (ret != 0) throw_ofi("fi_fabric (" + settings_.provider + ")", ret);
  ret = fi_domain(fabric_.get(), info_.get(), domain_.out(), nullptr);
  if (ret != 0) throw_ofi("fi_domain (" + settings_.domain + ")", ret);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = poll_mode_ == PollMode::kBusy ? FI_WAIT_NONE : FI_WAIT_UNSPEC;
  cq_attr.size = 0;
  ret = fi_cq_open(domain_.get(), &cq_attr, cq_.out(), nullptr);
  if (ret != 0) throw_ofi("fi_cq_open", ret);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  ret = fi_av_open(domain_.get(), &av_attr, av_.out(), nullptr);
  if (ret != 0) throw_ofi("fi_av_open", ret);
  ret = fi_endpoint(domain_.get(), info_.get(), ep_.out(), nullptr);
  if (ret != 0) throw_ofi("fi_endpoint", ret);
  ret = fi_ep_bind(ep_.get(), &cq_->fid, FI_TRANSMIT | FI_RECV);
  if (ret != 0) throw_ofi("fi_ep_bind (CQ)", ret);
  ret = fi_ep_bind(ep_.get(), &av_->fid, 0);
  if (ret != 0) throw_ofi("fi_ep_bind (AV)", ret);
  if (settings_.efa) {
    // Retry receiver-not-ready without bound (the EFA default gives up after a few tries).
    size_t retries = 7;
    ret = fi_setopt(&ep_->fid, FI_OPT_ENDPOINT, kOfiOptEfaRnrRetry, &retries, sizeof(retries));
    if (ret != 0) throw_ofi("fi_setopt (FI_OPT_EFA_RNR_RETRY)", ret);
  }
  ret = fi_enable(ep_.get());
  if (ret != 0) throw_ofi("fi_enable", ret);
}

OfiDomain::~OfiDomain() {
  stop();
  ep_.reset();
  av_.reset();
  cq_.reset();
  domain_.reset();
  fabric_.reset();
}

std::string OfiDomain::address() const {
  std::string addr(256, '\0');
  size_t len = addr.size();
  int ret = fi_getname(&ep_->fid, addr.data(), &len);
  if (ret == -FI_ETOOSMALL) {
    addr.resize(len);
    ret = fi_getname(&ep_->fid, addr.data(), &len);
  }
  if (ret != 0) throw_ofi("fi_getname", ret);
  addr.resize(len);
  return addr;
}

std::shared_ptr<OfiPeer> OfiDomain::peer(const std::string& address) {
  std::lock_guard<std::mutex> lock(av_mu_);
  auto it = peers_.find(address);
  if (it != peers_.end()) return it->second;
  fi_addr_t out = FI_ADDR_NOTAVAIL;
  const int n = fi_av_insert(av_.get(), address.data(), 1, &out, 0, nullptr);
  if (n != 1) throw_ofi("fi_av_insert (the peer's address)", n < 0 ? n : -FI_EINVAL,
                        ErrorKind::kConnection);
  auto made = std::make_shared<OfiPeer>();
  made->addr_ = out;
  made->address_ = address;
  peers_.emplace(address, made);
  return made;
}

void OfiDomain::renew(OfiPeer& peer) {
  std::lock_guard<std::mutex> lock(av_mu_);
  if (peer.connect_failed_.load()) {
    ++peer.renewals_;
    return;
  }
  fi_addr_t old = peer.addr_.load();
  const int removed = fi_av_remove(av_.get(), &old, 1, 0);
  if (removed != 0) throw_ofi("fi_av_remove (the peer's address)", removed, ErrorKind::kConnection);
  fi_addr_t out = FI_ADDR_NOTAVAIL;
  const int n = fi_av_insert(av_.get(), peer.address_.data(), 1, &out, 0, nullptr);
  if (n != 1) throw_ofi("fi_av_insert (the peer's address)", n < 0 ? n : -FI_EINVAL,
                        ErrorKind::kConnection);
  peer.addr_ = out;
  ++peer.renewals_;
}

OfiHandle<fid_mr> OfiDomain::register_memory(uint8_t* addr, uint64_t length, uint32_t access,
                                             uint32_t* key, int cuda_device) {
  iovec iov{addr, length};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = mr_access(access);
  attr.requested_key = *key;
  attr.iface = cuda_device < 0 ? FI_HMEM_SYSTEM : FI_HMEM_CUDA;
  if (cuda_device >= 0) attr.device.cuda = cuda_device;
  OfiHandle<fid_mr> mr;
  int ret = fi_mr_regattr(domain_.get(), &attr, 0, mr.out());
  if (ret != 0) {
    const std::string what = cuda_device < 0 ? "" : ", GPU memory of device " +
                                                        std::to_string(cuda_device) + " (FI_HMEM_CUDA)";
    throw_ofi("fi_mr_regattr (" + std::to_string(length) + " bytes" + what + ")", ret,
              ErrorKind::kRegistration);
  }
  if (settings_.mr_endpoint) {
    ret = fi_mr_bind(mr.get(), &ep_->fid, 0);
    if (ret != 0) throw_ofi("fi_mr_bind (FI_MR_ENDPOINT)", ret, ErrorKind::kRegistration);
    ret = fi_mr_enable(mr.get());
    if (ret != 0) throw_ofi("fi_mr_enable (FI_MR_ENDPOINT)", ret, ErrorKind::kRegistration);
  }
  if (settings_.mr_prov_key) {
    const uint64_t k = fi_mr_key(mr.get());
    if (k == FI_KEY_NOTAVAIL || k > UINT32_MAX) {
      throw Error(ErrorKind::kUnsupported,
                  "provider " + settings_.provider + " gave an MR key of more than 32 bits (" +
                      std::to_string(k) + "); rdmaxfer's descriptors carry 32-bit keys");
    }
    *key = static_cast<uint32_t>(k);
  }
  return mr;
}

void OfiDomain::post(std::unique_ptr<OfiOp> op, const char* what,
                     const std::function<bool()>& give_up,
                     const std::function<ssize_t(void*)>& attempt) {
  OfiOp* raw = op.get();
  // Once posted, the op may complete and be deleted on the completion thread at once: what is
  // used after the attempt is held here (the domain's peers_ keeps the entry alive anyway).
  const std::shared_ptr<OfiPeer> peer = raw->peer;
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    if (stop_.load()) throw Error(ErrorKind::kClosed, std::string(what) + ": the engine is closed");
    outstanding_.insert(raw);
  }
  if (peer) ++peer->in_flight_;
  auto forget = [&] {
    if (peer) --peer->in_flight_;
    std::lock_guard<std::mutex> lock(ops_mu_);
    outstanding_.erase(raw);
  };
  int tries = 0;
  const auto stall_end = std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(kPostStallS));
  for (;;) {
    const ssize_t ret = attempt(&raw->context);
    if (ret == 0) {
      if (peer) peer->connect_failed_.store(false, std::memory_order_relaxed);
      break;
    }
    if (ret != -FI_EAGAIN) {
      if (peer) peer->connect_failed_.store(true);
      forget();
      throw_ofi(what, static_cast<int>(ret));
    }
    if (give_up() || stop_.load()) {
      forget();
      throw Error(ErrorKind::kConnection,
                  std::string(what) + ": the connection to the peer was lost (or the endpoint "
                                      "closed, or the wait ran out) while the provider took no "
                                      "new operation");
    }
    if (std::chrono::steady_clock::now() > stall_end) {
      forget();
      throw Error(ErrorKind::kConnection,
                  std::string(what) + ": the provider took no new operation for " +
                      std::to_string(static_cast<int>(kPostStallS)) +
                      " s (its queue stayed full, or its connection to the peer was not set up)");
    }
    // The queue is full: the completion thread drains it. Yield, then sleep a little.
    if (++tries < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  op.release();  // libfabric holds it now; complete() deletes it
}

void OfiDomain::post_write(std::unique_ptr<OfiOp> op, void* local, uint64_t length, void* desc,
                           const std::shared_ptr<OfiPeer>& peer, uint64_t remote, uint64_t key,
                           const uint32_t* data, const std::function<bool()>& give_up) {
  op->peer = peer;
  const fi_addr_t to = peer->addr();
  const uint64_t flags = FI_COMPLETION | (data != nullptr ? FI_REMOTE_CQ_DATA : 0) |
                         (settings_.delivery_complete ? FI_DELIVERY_COMPLETE : 0);
  const uint64_t cq_data = data != nullptr ? *data : 0;
  post(std::move(op), data != nullptr ? "fi_writemsg (with CQ data)" : "fi_writemsg", give_up,
       [&](void* context) {
         iovec iov{local, length};
         void* descs[1] = {desc};
         fi_rma_iov rma{remote, length, key};
         fi_msg_rma msg{&iov, descs, 1, to, &rma, 1, context, cq_data};
         return fi_writemsg(ep_.get(), &msg, flags);
       });
}

void OfiDomain::post_read(std::unique_ptr<OfiOp> op, void* local, uint64_t length, void* desc,
                          const std::shared_ptr<OfiPeer>& peer, uint64_t remote, uint64_t key,
                          const std::function<bool()>& give_up) {
  op->peer = peer;
  const fi_addr_t to = peer->addr();
  post(std::move(op), "fi_readmsg", give_up, [&](void* context) {
    iovec iov{local, length};
    void* descs[1] = {desc};
    fi_rma_iov rma{remote, length, key};
    fi_msg_rma msg{&iov, descs, 1, to, &rma, 1, context, 0};
    return fi_readmsg(ep_.get(), &msg, FI_COMPLETION);
  });
}

void OfiDomain::start() { thread_ = std::thread([this] { run(); }); }

void OfiDomain::stop() {
  if (stop_.exchange(true)) return;
  if (cq_.get() != nullptr && poll_mode_ != PollMode::kBusy) fi_cq_signal(cq_.get());
  if (thread_.joinable()) thread_.join();
  // Close the endpoint first: its operations can no longer complete, so fail them here.
  ep_.reset();
  std::unordered_set<OfiOp*> left;
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    left.swap(outstanding_);
  }
  for (OfiOp* op : left) {
    if (op->peer) --op->peer->in_flight_;
    op->done(kOfiEngineClosed, 0, "the engine closed before the operation completed");
    delete op;
  }
}

void OfiDomain::complete(void* context, int err, int prov_errno, const std::string& text) {
  auto* op = static_cast<OfiOp*>(context);
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    if (outstanding_.erase(op) == 0) {
      // Not an operation of ours that is still outstanding: the provider completed one twice,
      // or late. Never expected; shown, since it could be taken for another operation's.
      log::write(log::Level::kWarning, "ofi " + settings_.domain +
                                           ": a completion for no outstanding operation (" +
                                           (err == 0 ? std::string("success") : text) + ")");
      return;
    }
  }
  if (op->peer) --op->peer->in_flight_;
  op->done(err, prov_errno, text);
  delete op;
}

void OfiDomain::run() {
  std::vector<fi_cq_data_entry> entries(kCqBatch);
  while (!stop_.load()) {
    ssize_t n = poll_mode_ == PollMode::kBusy
                    ? fi_cq_read(cq_.get(), entries.data(), entries.size())
                    : fi_cq_sread(cq_.get(), entries.data(), entries.size(), nullptr,
                                  kSreadTimeoutMs);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        const fi_cq_data_entry& e = entries[static_cast<size_t>(i)];
        if ((e.flags & FI_REMOTE_CQ_DATA) != 0 && (e.flags & FI_REMOTE_WRITE) != 0) {
          if (on_remote_data_) on_remote_data_(static_cast<uint32_t>(e.data));
        } else if (e.op_context != nullptr) {
          complete(e.op_context, 0, 0, "");
        }
      }
    } else if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_.get(), &err, 0) == 1) {
        char buf[256] = {0};
        const char* detail = fi_cq_strerror(cq_.get(), err.prov_errno, err.err_data, buf,
                                            sizeof(buf));
        const std::string text = ofi_error_text("completion", -err.err) +
                                 (detail != nullptr && *detail != 0 ? std::string(": ") + detail
                                                                    : "");
        if (err.op_context != nullptr) {
          complete(err.op_context, err.err, err.prov_errno, text);
        } else {
          log::write(log::Level::kWarning, "ofi: a failed completion without context: " + text);
        }
      }
    } else if (n == -FI_EAGAIN) {
      if (poll_mode_ == PollMode::kBusy) std::this_thread::yield();
    } else if (n < 0 && n != -FI_EINTR && n != -FI_ECANCELED) {
      log::write(log::Level::kError, ofi_error_text("fi_cq_sread", static_cast<int>(n)));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace rdmaxfer
