// The ofi transport: RDMA over libfabric (EFA, verbs through ofi_rxm, and every provider that
// offers reliable datagram endpoints with RMA), loaded at run time (ofi_api.h).
//
// One domain (ofi_domain.h) per rail, a rail being one NIC (EFA's usual shape: 2-4 per GPU):
// its FI_EP_RDM endpoint, address vector and completion queue serve every peer. Memory is
// registered in every rail's domain, so a descriptor carries a key per rail (core/descriptor.h).
// A connection is one bootstrap TCP stream (transport/bootstrap.h, authenticated like every
// transport's) on which the two sides swap endpoint records (ofi_wire.h: a fabric address per
// rail, largest message, provider) and insert each other into the AVs, rail i with the peer's
// rail i; the stream then carries the control messages and tells each side when the other is
// gone. How a connection stripes over its rails and fails over: ofi_channel.h.
//
// Lifecycle: constructed (the domain opened, its completion thread running; throws
// Error(kUnsupported) when no provider fits) -> listen()/accept()/connect() -> shutdown() (every
// channel aborted, the acceptor stopped, the completion thread joined; operations still
// outstanding fail with kClosed). Registrations keep the domain alive until their last MR closes.
//
// Settings (read at construction): RDMAXFER_OFI_PROVIDER names the provider ("efa",
// "verbs;ofi_rxm", "tcp;ofi_rxm"; default: the first hardware RDMA provider, never tcp or shm);
// RDMAXFER_OFI_IFACE the domains, one rail each (a NIC, or for tcp the network interface,
// "lo"; several separated by commas or spaces; "auto": every domain of the provider; default:
// the first domain).
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/bootstrap.h"
#include "transport/ofi/ofi_channel.h"
#include "transport/ofi/ofi_domain.h"
#include "transport/ofi/ofi_wire.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace rdmaxfer {

struct OfiConfig {
  std::string provider;  // "" : the first hardware RDMA provider
  std::string iface;     // "" : the first domain; "a,b": one rail each; "auto": every domain
  std::string secret;    // the bootstrap's shared secret (transport/auth.h)
  PollMode poll_mode = PollMode::kAdaptive;
  // Ask the provider for FI_HMEM (GPU memory registered with the NIC) when CUDA loads here;
  // false: GPU memory is staged through host memory.
  bool hmem = true;
  // TLS 1.3 on the bootstrap stream, and so on every control message after it (transport/tls.h).
  bool tls = false;
  TlsSettings tls_settings;
  // From the engine's settings ("ofi.provider", "ofi.iface", "ofi.hmem", "ofi.tls"...), else
  // the environment (RDMAXFER_OFI_PROVIDER, RDMAXFER_OFI_IFACE, RDMAXFER_OFI_HMEM=0 turns
  // FI_HMEM off), and those every transport shares (secret, poll_mode).
  static OfiConfig from(const TransportConfig& config);
};

// "" when the ofi transport can run here with `config`, else why not (libfabric missing; with a
// provider named, no domain of it fits: fi_getinfo asked once per (provider, iface)). With no
// provider named, the domain is found when an engine opens one.
std::string ofi_unavailable_reason(const OfiConfig& config);

// "" when transport="auto" may take ofi here, else why not: only a hardware RDMA provider (EFA,
// verbs, ...), never one that emulates RDMA over sockets or memory, even when named; with none
// named, fi_getinfo is asked (once per (provider, iface)), so auto asks only once verbs RC was
// refused.
std::string ofi_auto_unavailable_reason(const OfiConfig& config);

// The most rails an ofi engine opens (as many as its endpoint record carries); a grant's token
// carries its rail in kOfiRailBits bits.
constexpr size_t kOfiMaxRails = OfiEndpointRecord::kMaxRails;
constexpr uint32_t kOfiRailBits = 3;
static_assert((size_t{1} << kOfiRailBits) >= kOfiMaxRails, "a token's rail bits name every rail");

// The domain names `config.iface` lists, rail 0 first ({""}: the first domain). "auto" asks
// fi_getinfo for every domain of the provider (the first kOfiMaxRails). Throws Error(kInvalidArgument) for a repeated
// name or more than kOfiMaxRails, Error(kUnsupported) when "auto" finds none.
std::vector<std::string> ofi_rail_names(const OfiConfig& config);

class OfiTransport : public Transport {
 public:
  OfiTransport(uint64_t engine_id, OfiConfig config);
  ~OfiTransport() override;
  // What the transport declares before any instance exists (transport/registry.h).
  static Capabilities declared();

  Capabilities capabilities() const override;
  std::string gpu_direct_off() const override;
  std::vector<std::string> rails() const override;
  std::string describe() const override;
  uint16_t listen(const std::string& host, uint16_t port) override;
  std::shared_ptr<Channel> accept(double timeout_s) override;
  std::shared_ptr<Channel> connect(const std::string& host, uint16_t port,
                                   const ConnectOptions& options) override;
  void shutdown() override;

  // Registers memory in rail `rail`'s domain with a key of our choosing unless the provider
  // picks it.
  OfiHandle<fid_mr> register_mr(size_t rail, uint8_t* addr, uint64_t length, uint32_t access,
                                uint32_t* key, int cuda_device = -1);
  // Grants by token (the remote CQ data of their notified writes), across channels. A token's
  // low kOfiRailBits bits are the rail whose key the grant gave (the writer posts there).
  uint32_t add_grant(std::weak_ptr<OfiChannel> channel, size_t rail);
  void drop_grant(uint32_t token);
  // Starts the rail watch unless it runs: every kRailWatchS it lets each channel ask its failed
  // rails back (OfiChannel::heal_tick), until the transport shuts down.
  void watch_rails();
  // A region of `length` bytes of page-aligned memory on every rail, readable by peers, that
  // no MemoryDomain lists (an endpoint's probe word, ofi_heal.cc).
  std::shared_ptr<MemoryRegion> probe_region(uint64_t length);

 protected:
  std::shared_ptr<MemoryRegion> make_region(uint8_t* addr, uint64_t length, uint32_t access,
                                            std::unique_ptr<PinnedAllocation> owned) override;
  // GPU memory: registered with FI_HMEM_CUDA where the provider granted FI_HMEM (the provider
  // exports it itself: libfabric 1.17's fi_mr_attr takes no dmabuf), else refused (staged).
  std::shared_ptr<MemoryRegion> make_device_region(uint8_t* addr, uint64_t length,
                                                   uint32_t access, int dmabuf_fd,
                                                   uint64_t dmabuf_offset) override;

 private:
  // A region over every rail (its MRs in each domain); `cuda_device` >= 0: GPU memory.
  std::shared_ptr<MemoryRegion> region_on_rails(uint8_t* addr, uint64_t length, uint32_t access,
                                                std::unique_ptr<PinnedAllocation> owned,
                                                int cuda_device);
  SocketOptions bootstrap_options() const;
  // The endpoint-record exchange on a bootstrapped stream (through its TLS session when TLS is
  // on); returns the started channel, which keeps both.
  std::shared_ptr<OfiChannel> handshake(UniqueFd fd, std::unique_ptr<TlsSession> tls,
                                        const std::string& peer, const Deadline& deadline,
                                        bool connector);
  void rail_watch();  // the watch thread
  void accept_group(AcceptedGroup group);
  void on_remote_data(uint32_t token);
  static uint32_t random_key();  // from the kernel CSPRNG, never 0

  const OfiConfig config_;
  std::shared_ptr<const TlsContext> tls_;  // null: plain bootstrap and control stream
  // Connects in their handshake, ended by shutdown() (transport/socket.h).
  std::shared_ptr<PendingConnects> connects_ = std::make_shared<PendingConnects>();
  std::vector<std::shared_ptr<OfiDomain>> domains_;  // the rails, rail 0 first
  mutable std::mutex mu_;
  std::condition_variable accepted_cv_;
  bool shut_down_ = false;
  std::unique_ptr<Acceptor> acceptor_;
  std::deque<std::shared_ptr<OfiChannel>> accepted_;
  std::vector<std::weak_ptr<OfiChannel>> channels_;
  std::condition_variable watch_cv_;  // mu_: wakes the watch when the transport shuts down
  std::thread watch_;                 // mu_: started by watch_rails()
  std::mutex grants_mu_;
  std::map<uint32_t, std::weak_ptr<OfiChannel>> grants_;
};

}  // namespace rdmaxfer
