// One libfabric domain as the ofi transport uses it: fabric, domain, address vector, one
// completion queue and one FI_EP_RDM endpoint serving every peer, plus the completion thread.
//
// Lifecycle: open() (fi_getinfo with the hints of ofi_settings.h; the first usable answer) ->
// start() (the completion thread) -> posts and registrations -> stop() (the thread joined, the
// endpoint closed; every operation still outstanding fails with kClosed) -> destroyed (AV, CQ,
// domain, fabric closed, children first).
//
// Completions are read by the completion thread: blocked on the CQ's wait object
// (fi_cq_sread, which also drives a manual-progress provider) unless poll_mode is "busy", which
// spins on fi_cq_read. An operation's completion runs its OfiOp's callback there; a remote
// write carrying CQ data (a notification's part) goes to the remote-data handler with its
// 32-bit value. Nothing assumes an order between completions.
#pragma once

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/poll_mode.h"
#include "core/region.h"
#include "transport/ofi/ofi_api.h"
#include "transport/ofi/ofi_settings.h"

namespace rdmaxfer {

// The err an OfiOp's callback gets when the domain stopped before the operation completed.
constexpr int kOfiEngineClosed = -1;

// A peer's entry in a domain's address vector (OfiDomain::peer): one per peer address for the
// domain's life, shared by every endpoint to that address, so that libfabric holds the
// address once and removing it (OfiDomain::renew, with FI_AV_REMOVE_CLEANUP: ofi_api.cc)
// releases the provider's connection to the peer. Entries are never removed otherwise: the
// provider's connection to a peer outlives an endpoint, and a new endpoint to the same peer
// reuses it (ofi_rxm refuses a second connection from a peer whose first one it still holds).
class OfiPeer {
 public:
  fi_addr_t addr() const { return addr_.load(); }
  const std::string& address() const { return address_; }
  // Operations posted to the peer and not complete yet.
  uint64_t in_flight() const { return in_flight_.load(); }
  // How many times OfiDomain::renew gave it a new entry.
  uint64_t renewals() const { return renewals_.load(); }

 private:
  friend class OfiDomain;
  std::atomic<fi_addr_t> addr_{FI_ADDR_NOTAVAIL};
  std::string address_;
  std::atomic<uint64_t> in_flight_{0};
  std::atomic<uint64_t> renewals_{0};
  // The last post to the peer failed at once (the provider could not set up its connection):
  // ofi_rxm then keeps an idle connection object without an endpoint, which removing the
  // entry would close (a crash in libfabric 1.17); there is nothing to release either.
  std::atomic<bool> connect_failed_{false};
};

// One posted operation; libfabric holds it (by its context) until it completes.
struct OfiOp {
  fi_context2 context;  // first: the provider's per-operation room (FI_CONTEXT2)
  RegionUse hold;       // the local memory, held until the operation completes
  std::shared_ptr<OfiPeer> peer;  // its AV entry, held until the operation completes (posted)
  // err 0: success, kOfiEngineClosed, else the completion's errno, the provider's own errno
  // (prov_errno) and text.
  std::function<void(int err, int prov_errno, const std::string& text)> done;
};

// A registration in each domain of the transport (its rails: fi_mr_regattr in every one,
// bound to its endpoint where FI_MR_ENDPOINT). The region keeps its domains alive (a parent
// outlives its children): the MRs close first.
class OfiDomain;
class OfiRegion : public MemoryRegion {
 public:
  // One rail's registration: its domain, MR and the key peers name it by there.
  struct RailMr {
    std::shared_ptr<OfiDomain> domain;
    OfiHandle<fid_mr> mr;
    uint32_t key = 0;
  };
  // `mrs`: rail 0 first (its key becomes key()).
  OfiRegion(uint8_t* addr, uint64_t length, uint32_t access,
            std::unique_ptr<PinnedAllocation> owned, std::vector<RailMr> mrs);
  // fi_mr_desc on `rail`: the local descriptor (FI_MR_LOCAL); null past the region's rails.
  void* desc(size_t rail = 0) const;
  std::vector<uint32_t> rail_keys() const override;
  // The key peers name the memory by on `rail` (0 past the region's rails).
  uint32_t key_on(size_t rail) const { return rail < mrs_.size() ? mrs_[rail].key : 0; }
  int home_rail() const override { return home_rail_.load(); }
  void set_home_rail(int rail) override { home_rail_.store(rail); }

 protected:
  void release_handle() override { mrs_.clear(); }

 private:
  std::vector<RailMr> mrs_;
  std::atomic<int> home_rail_{-1};
};

class OfiDomain {
 public:
  // Opens the first provider answer that decide_settings accepts; throws Error(kUnsupported)
  // naming each refusal when none does. `ask_hmem`: prefer an answer with FI_HMEM (GPU memory
  // registered with the NIC; settings().hmem says whether it came).
  static std::shared_ptr<OfiDomain> open(const std::string& provider, const std::string& domain,
                                         PollMode poll_mode, bool ask_hmem);
  // The settings open() would use, without opening anything; throws like open().
  static OfiSettings probe(const std::string& provider, const std::string& domain);
  // The domains (NICs) of `provider` ("" : the first hardware RDMA provider) that
  // decide_settings accepts, in fi_getinfo's order, each once: the rails of ofi.iface="auto".
  // Throws Error(kUnsupported) when there is none.
  static std::vector<std::string> domains(const std::string& provider);
  ~OfiDomain();
  OfiDomain(const OfiDomain&) = delete;
  OfiDomain& operator=(const OfiDomain&) = delete;

  const OfiSettings& settings() const { return settings_; }
  // This endpoint's address (fi_getname), for the peer's address vector.
  std::string address() const;
  // The AV entry of the peer at `address` (its fi_getname), inserted on first use. Throws
  // Error(kConnection) on a malformed address.
  std::shared_ptr<OfiPeer> peer(const std::string& address);
  // Removes `peer`'s entry from the AV and inserts its address again: the provider drops what
  // it held for the peer (ofi_rxm: its connection, whose QP may be in error) and the next
  // operation sets it up afresh. Not when the last post to the peer failed at once: the
  // provider holds no connection then, and the next operation sets one up anyway. Throws
  // Error(kConnection) with the provider's reason.
  void renew(OfiPeer& peer);

  // Registers [addr, addr+length) for `access` (Access bits); `key` is the key asked for when
  // the provider does not choose keys (FI_MR_PROV_KEY unset). `cuda_device` >= 0: the range is
  // memory of that CUDA device (FI_HMEM_CUDA; only with settings().hmem). Returns the MR and
  // sets *key to the key peers use. Throws Error(kRegistration) with the provider's reason.
  OfiHandle<fid_mr> register_memory(uint8_t* addr, uint64_t length, uint32_t access,
                                    uint32_t* key, int cuda_device = -1);

  // Posts one RMA (fi_writemsg / fi_readmsg; `data` set: a write with remote CQ data), retrying
  // while the provider answers FI_EAGAIN until `give_up()` says to stop (then throws
  // Error(kConnection)). The op's callback runs on completion (or on stop()). Takes ownership.
  void post_write(std::unique_ptr<OfiOp> op, void* local, uint64_t length, void* desc,
                  const std::shared_ptr<OfiPeer>& peer, uint64_t remote, uint64_t key,
                  const uint32_t* data, const std::function<bool()>& give_up);
  void post_read(std::unique_ptr<OfiOp> op, void* local, uint64_t length, void* desc,
                 const std::shared_ptr<OfiPeer>& peer, uint64_t remote, uint64_t key,
                 const std::function<bool()>& give_up);

  // The handler of remote writes that carried CQ data (set before start()).
  void set_remote_data_handler(std::function<void(uint32_t)> handler) {
    on_remote_data_ = std::move(handler);
  }
  void start();
  void stop();

 private:
  OfiDomain(OfiInfo info, OfiSettings settings, PollMode poll_mode);
  void run();
  void complete(void* context, int err, int prov_errno, const std::string& text);
  void post(std::unique_ptr<OfiOp> op, const char* what, const std::function<bool()>& give_up,
            const std::function<ssize_t(void*)>& attempt);


  OfiInfo info_;
  const OfiSettings settings_;
  const PollMode poll_mode_;
  OfiHandle<fid_fabric> fabric_;
  OfiHandle<fid_domain> domain_;
  OfiHandle<fid_cq> cq_;
  OfiHandle<fid_av> av_;
  OfiHandle<fid_ep> ep_;
  std::function<void(uint32_t)> on_remote_data_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex ops_mu_;
  std::unordered_set<OfiOp*> outstanding_;
  std::mutex av_mu_;
  std::map<std::string, std::shared_ptr<OfiPeer>> peers_;  // av_mu_: by address
};

}  // namespace rdmaxfer
