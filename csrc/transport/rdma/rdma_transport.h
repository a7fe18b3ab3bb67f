// The verbs transport: the whole API over RC queue pairs (libibverbs, loaded at run time).
//
// Lifecycle: constructed (fabric settings checked; each rail's device opened with its PD,
// completion channel, CqSet, completion thread running and SRQ, unless the device has none
// (max_srq 0) or env RDMAXFER_SRQ=0: then each QP posts its own receives; rdma_rails.h) -> listen() (bootstrap
// acceptor: every peer's Hello and then its verbs handshake run on a thread of their own,
// bounded by the handshake timeout, so a connect() completes before accept() is called, as on
// TCP, and a stalled peer delays nobody) -> connections by accept()/connect(): the TCP
// bootstrap (one stream, its wire id) carries the endpoint records
// (endpoint_record.h), then stays open as the connection's liveness/close channel ->
// shutdown(): handshakes in progress cut, every connection aborted, the completion threads
// stopped, then every handle on every device let go of at once (as for a removed device, see
// below), so a closed engine that something still references holds no device.
//
// A connection's QPs on one rail complete on one CQ of that rail's CqSet (cq_set.h: CQs
// created on demand, all on the rail's channel and poller); a completion finds its connection
// through the tag in its wr_id, a receive of the rail's SRQ (verbs_srq.h: every QP of a rail
// takes its control receives from it) through its qp_num. Each connection reserves its share of its CQ on every rail it
// uses, so a CQ never overruns. Fabric settings (fabric_settings.h) apply to the QPs of every
// rail. A device's fatal event or a failed completion thread fails its rail over in every
// connection (rdma_connection.h).
//
// Device removal (rdma_removal.cc), on an engine of two rails or more: a rail watch thread lists
// the devices (ibv_get_device_list) every kRailCheckS seconds. A device being unregistered
// (`rdma link delete`, a driver unbind or hot unplug) leaves that list at once, and a device
// without disassociate_ucontext (rxe) keeps working and sends no event meanwhile: the kernel
// waits, inside the unregistration, until every process has let go of it. So when a rail's
// device is missing from the list, or its IBV_EVENT_DEVICE_FATAL came, the watch fails the
// rail over in every connection, stops its completion thread and releases everything the
// engine holds on it: every connection's QPs there (release_rail), the MR of every
// registration on its PD, its SRQ, CQs, completion channel, PD and context. The
// unregistration then completes; registrations keep working on the other rails; describe()
// shows the rail removed with its cause.
//
// A device that comes back (`rdma link add`, a driver bound again) under the same name, its
// port ACTIVE (and, where the rail had an IPv4 RoCE GID, that GID listed again), is opened
// again by the watch (readd_rail): a new context, PD, channel, CQs, completion thread and SRQ;
// every live host registration gets an MR in the new PD (new lkey and rkey there; GPU memory
// does not: its dmabuf fd is gone, so that memory goes on over the other rails). The engine's
// descriptor generation (key_generation, core/descriptor.h) goes up by one and becomes the
// rail's (its EndpointRecord::Rail::generation); then every connection that had QPs on it
// creates new ones there (RdmaConnection::rail_back) and the rail rejoins as a healed one does
// (rdma_healing.cc), the new QPNs exchanged on the control lane. Peers use the rail's rkeys
// only from descriptors at least as new as its generation: an older descriptor's keys there
// belong to the MRs of the device that went.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "transport/bootstrap.h"
#include "transport/rdma/rdma_config.h"
#include "transport/rdma/rdma_connection.h"
#include "transport/transport.h"

namespace rdmaxfer {

class RdmaTransport : public Transport {
 public:
  RdmaTransport(uint64_t engine_id, const RdmaConfig& config);
  ~RdmaTransport() override;

  // What every verbs transport can do (registered in rdma_registration.cc); an instance adds
  // its devices' largest message.
  static Capabilities declared();
  Capabilities capabilities() const override;
  std::string describe() const override;
  std::vector<std::string> rails() const override;
  // "recv_buffers.posted" / "recv_buffers.allocated": every rail's SRQ plus the receive
  // buffers of the QPs that have their own.
  std::vector<std::pair<std::string, uint64_t>> gauges() const override;
  uint16_t listen(const std::string& host, uint16_t port) override;
  std::shared_ptr<Channel> accept(double timeout_s) override;
  std::shared_ptr<Channel> connect(const std::string& host, uint16_t port,
                                      const ConnectOptions& options) override;
  void shutdown() override;

 protected:
  std::shared_ptr<MemoryRegion> make_region(uint8_t* addr, uint64_t length, uint32_t access,
                                            std::unique_ptr<PinnedAllocation> owned) override;
  std::shared_ptr<MemoryRegion> make_device_region(uint8_t* addr, uint64_t length,
                                                   uint32_t access, int dmabuf_fd,
                                                   uint64_t dmabuf_offset) override;

 private:
  // A connection with QPs on `lanes`, room reserved for them in each rail's CqSet. Throws
  // Error(kConnection) when a rail's CqSet is full (cq_set.h).
  std::shared_ptr<RdmaConnection> prepare(const std::vector<LaneSpec>& lanes);
  // Gives back the CQ entries `tag` reserved on every rail (CqSet::release); mu_ held.
  void release_cqs_locked(uint32_t tag);
  // The acceptor's QPs for a connector's record (see endpoint_record.h); none when no rail of
  // ours reaches one of the peer's (the acceptor then answers with a record without QPs).
  std::vector<LaneSpec> pair_rails(const EndpointRecord& peer) const;
  // A rail's device failed: every connection fails over (RdmaConnection::rail_down).
  void rail_failed(int rail, const std::string& cause);
  // Device removal (rdma_removal.cc, see above).
  void start_rail_watch();
  void stop_rail_watch();
  void watch_rails();  // the watch thread
  // IBV_EVENT_DEVICE_FATAL of `rail`: the watch removes it at once.
  void device_fatal(int rail, const std::string& cause);
  // Fails `rail` over everywhere and releases every handle on its device. On the watch thread.
  void remove_rail(int rail, const std::string& cause);
  // Lets go of every handle on `rail`'s device: `conns`' QPs and buffers there, the
  // registrations' MRs, then the rail's CQs, SRQ, PD and context. Its completion thread is
  // stopped already.
  void release_handles(int rail, const std::string& cause,
                       const std::vector<std::shared_ptr<RdmaConnection>>& conns);
  bool rail_removed(size_t rail) const;
  // Opens a rail's PD, completion channel, completion thread (not started), CqSet and SRQ on
  // its context (rail index `index`).
  void open_handles(Rail& rail, int index);
  // The device of removed rail `rail` is listed again: opens it again and lets every
  // connection rejoin over it (see above). Nothing changes when it is not ready yet (its port
  // not ACTIVE, its IPv4 GID not back); the watch tries again next period. On the watch thread.
  void readd_rail(size_t rail);
  uint16_t key_generation() const override { return generation_.load(); }
  // The PDs new registrations get an MR in (null: a removed rail), and the registrations to
  // drop a removed rail's MR from.
  PdList current_pds() const;
  void track(const std::shared_ptr<RdmaRegion>& region);
  static EndpointRecord read_record(int fd, TlsSession* tls, const Deadline& deadline);
  // Sends our record, reads the peer's (unless the acceptor already has it), brings the QPs to
  // RTS, then the READY exchange; through `tls` when not null.
  void handshake(RdmaConnection& conn, int fd, TlsSession* tls, const EndpointRecord* peer_record,
                 const Deadline& deadline);
  std::shared_ptr<RdmaConnection> find(uint32_t tag);
  // The connection holding QP `qp_num` of `rail` (SRQ receives name no connection in wr_id).
  std::shared_ptr<RdmaConnection> find_qp(int rail, uint32_t qp_num);
  void forget_qps_locked(uint32_t tag);
  // Connection `tag`'s QP `old_qpn` of `rail` was renewed as `new_qpn` (rail healing).
  void renumber_qp(int rail, uint32_t old_qpn, uint32_t new_qpn, uint32_t tag);
  // Every connection object alive (closed ones still held included).
  std::vector<std::shared_ptr<RdmaConnection>> live_connections() const;
  // The rail's SRQ, or why it has none (env RDMAXFER_SRQ=0, max_srq 0, ibv_create_srq failed).
  void open_srq(Rail& rail);
  void on_completions(int rail, const ibv_wc* wcs, int n);
  // A receive completion of `rail`'s SRQ: to its connection by qp_num, then the buffer back.
  void on_srq_receive(int rail, const ibv_wc& wc);
  void on_async_event(int rail, const ibv_async_event& event);
  void on_socket(uint64_t tag);
  void abort_all(ErrorKind kind, const std::string& reason);
  // The acceptor's on_group: the verbs handshake of one peer, on its handshake thread.
  void accept_group(AcceptedGroup group);
  std::shared_ptr<RdmaConnection> accept_one(AcceptedGroup group);

  SocketOptions bootstrap_options() const {
    SocketOptions o;
    o.secret = config_.secret;
    o.tls = tls_;
    o.pending = connects_;
    return o;
  }
  RdmaConfig config_;
  int max_cqe_ = 0;  // entries per CQ of a rail's CqSet
  std::atomic<uint16_t> generation_{0};  // devices come back so far (key_generation)
  std::shared_ptr<const TlsContext> tls_;  // null: a plain bootstrap stream
  // Connects in their handshake, ended by shutdown() (transport/socket.h).
  std::shared_ptr<PendingConnects> connects_ = std::make_shared<PendingConnects>();
  bool busy_poll_ = false;
  RdmaConnSettings settings_;
  std::vector<Rail> rails_;  // rdma_rails.h; rail 0 first. A removed rail's handles: mu_
  mutable std::mutex regions_mu_;
  PdList pds_;  // each rail's PD, in rail order: every registration covers them (regions_mu_)
  std::vector<std::weak_ptr<RdmaRegion>> regions_;  // regions_mu_
  size_t prune_at_ = 64;  // regions_ size at which expired entries are dropped

  std::thread watch_;  // the rail watch (two rails or more)
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;                   // watch_mu_
  std::vector<std::string> fatal_;            // per rail: DEVICE_FATAL's cause (watch_mu_)

  std::unique_ptr<Acceptor> acceptor_;
  std::condition_variable accepted_cv_;
  std::deque<std::shared_ptr<RdmaConnection>> accepted_;  // handshake done, not yet accept()ed
  mutable std::mutex mu_;
  bool shut_down_ = false;
  uint32_t next_tag_ = 1;
  std::unordered_map<uint32_t, std::weak_ptr<RdmaConnection>> connections_;
  // Closed ones no longer in connections_ that someone still holds (their QPs exist).
  std::vector<std::weak_ptr<RdmaConnection>> closed_;
  std::vector<std::unordered_map<uint32_t, uint32_t>> qp_tags_;  // per rail: QP number -> tag
  std::unordered_set<uint32_t> pending_;  // tags of connections being set up (prepare)
};

}  // namespace rdmaxfer
