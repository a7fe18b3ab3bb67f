// A connection to one peer over one or more RC QPs (the verbs Connection), on one or more rails
// (rdma_rails.h): each QP sits on one of this engine's rails and pairs with a QP on the peer's
// rail that it reaches (endpoint_record.h). One lane, the control lane (the first QP until its
// rail fails), carries the control SENDs, and grants are made on its rail (the control rail);
// a grant's CTS names that rail (its route) and the peer's WRITE_WITH_IMM into it goes on a QP
// paired with it.
//
// Lifecycle (explicit state, see State):
//   kPrepared   constructed by the transport: QPs created and in INIT (on the rail's SRQ, or
//               with receive buffers of their own, posted in connect_qps); local_record()
//               describes them for the peer.
//   kConnected  connect_qps(peer record): every QP through RTR to RTS (path MTU = min of both
//               ports' active MTU); then start(socket): the bootstrap TCP stream is watched for
//               GOODBYE / EOF and operations may be posted.
//   kClosed     close() (GOODBYE sent), the peer (GOODBYE or EOF on the bootstrap stream), a
//               completion with an error status, an async QP error, or abort() after a timeout.
//               Teardown: QPs to ERR (no more DMA; every outstanding WR and posted receive is
//               flushed), every pending request fails with the reason; the flush completions
//               are drained, and only then are the regions the WRs used and the temporary MRs
//               released (drained()); close() waits for that, bounded (kDrainTimeoutS). The
//               QPs, then their buffers, are destroyed with the object (a connection dropped
//               without close() destroys its QPs before anything the WRs used). A closed connection
//               refuses new operations with an EndpointClosed/ConnectionFailed error; the
//               engine keeps working.
//
// Operations (same semantics as TcpConnection):
//   WRITE / READ    one-sided, chunked (chunking.h, capped at the smaller max message of the two
//                   ports); done when every chunk's WR completed. From kStripeMin bytes on, the
//                   chunks are striped over every live rail, each rail's share in proportion
//                   to its link speed (smooth weighted round robin), and over that rail's QPs;
//                   smaller ones go on one rail: the local region's home rail when it has one
//                   (the NIC nearest its GPU, set at registration), else the least loaded.
//   failover        when a rail fails (an error completion or async QP error on one of its
//                   QPs, its device removed or its port down), its QPs go to ERR and every
//                   one-sided chunk queued or in flight on them is posted again on the live
//                   lanes (with that rail's lkey and the peer rail's rkey from the descriptor):
//                   the transfer completes. The peer is told (RAIL_DOWN, control_msg.h, on
//                   the live control lane) and fails over its QPs paired with that rail the
//                   same way (a deleted device or a QP in error leaves the peer's end up,
//                   and its WRs there would wait for the retries to run out); a lane is live
//                   while neither its rail nor the peer's rail it pairs with failed. When the
//                   control lane fails, it moves to the first live lane after it (or, if
//                   none, the first live one), and the control SENDs not completed on the
//                   failed lane are sent again there (a SEND the peer received but whose ACK
//                   was lost arrives twice; each carries a number and the receiver drops
//                   repeats); the peer moves its own control lane by the same rule on the
//                   RAIL_DOWN, or when a message arrives on a later lane than its control
//                   lane (lanes pair in the same order on both sides), so both end on the
//                   same rail pair and grants, CTS and WRITE_WITH_IMM flow there. A
//                   notified WRITE in flight on the failed rail fails (its grant's rkey is on
//                   the peer's old control rail); the connection stays. A control SEND that
//                   fails with RNR_RETRY_EXC_ERR (a peer that stopped reposting) closes the
//                   connection as before, and so does a failure on a connection's only live
//                   rail. Only when no lane is left does the connection close, with every
//                   failed rail's cause in the error.
//                   release_rail() then lets go of everything the connection holds on a
//                   rail whose device is being removed (its QPs destroyed, its buffers'
//                   MRs deregistered, its CQ, SRQ, PD and poller given back), so the
//                   device's unregistration can complete (rdma_transport.h).
//   control         SENDs of control_msg.h into the peer's control receive buffers (lane 0).
//   grant           the destination's region, or a temporary MR with REMOTE_WRITE over it if
//                   its region lacks that access, on the control rail; its address, rkey and
//                   rail (the route) go out in the CTS.
//   write_notify    RDMA WRITEs on one QP paired with the grant's rail (its route, from the
//                   CTS), the last as WRITE_WITH_IMM (imm = the value): RC
//                   delivers them in order, so the immediate's receive completion (on_notify
//                   at the peer) means every byte is in place.
//   gathered WRITEs and READs (GatherWrites, GatherReads: a batch's groups of small
//                   operations): one request for the group, one WR per piece, all on one QP,
//                   queued together so the send queue posts them as chains (one
//                   ibv_post_send each) with only every signal_every-th and the last
//                   signaled. When a piece's WR fails, the connection closes; the group
//                   reports that piece with its own error and the pieces after it (flushed)
//                   with the connection's, and completes: the pieces before it landed (RC
//                   completes a send queue in order).
// The protocol above (protocol/message_protocol.h) bounds the control SENDs by credits: at most
// `window` messages unanswered (the peer's ctrl_depth / 4, from its endpoint record). The
// receives come from the rail's shared receive queue (verbs_srq.h; a receive completion is
// handed here by its qp_num, on_srq_completion, and its buffer goes back to the SRQ when that
// returns): one pool for every peer, which grows from its low water before it runs dry, so a
// burst from many peers at once waits at most a few RNR retries for buffers. Without an SRQ
// each QP keeps `ctrl_depth` of its own posted, reposted as soon as they are consumed, and
// every control SEND and WRITE_WITH_IMM within the window lands in one. rnr_retry is finite
// (kRnrRetries): an RNR NAK past those retries means a peer that stopped reposting, and the
// send fails with IBV_WC_RNR_RETRY_EXC_ERR saying so.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/unique_fd.h"
#include "transport/rdma/buffer_slab.h"
#include "transport/rdma/control_msg.h"
#include "transport/rdma/cq_poller.h"
#include "transport/rdma/endpoint_record.h"
#include "transport/rail_meter.h"
#include "transport/rdma/rdma_rails.h"
#include "transport/rdma/send_queue.h"
#include "transport/rdma/verbs_mr.h"
#include "transport/gather.h"
#include "transport/rdma/verbs_qp.h"
#include "transport/tls.h"
#include "transport/transport.h"

namespace rdmaxfer {

// One-sided transfers of at least this many bytes are striped over the rails.
constexpr uint64_t kStripeMin = 512 * 1024;

struct RdmaConnSettings {
  uint64_t eager_limit = 8192;
  uint32_t ctrl_size = 16384;   // bytes per control buffer (largest control SEND)
  uint32_t ctrl_depth = 32;     // receive buffers per QP
  uint32_t ctrl_slots = 16;     // control send slots per QP
  QpLimits limits;
  uint64_t max_message = 1ull << 30;  // local port's max_msg_sz
};

// What a connection holds of its transport: the rails (each holds its PD, CqSet and poller by
// shared_ptr, so they outlive the connections) and, per rail it has QPs on, the CQ it reserved
// room on in that rail's CqSet (null for a rail it does not use).
struct RdmaShared {
  std::vector<Rail> rails;
  std::vector<std::shared_ptr<CompletionQueue>> cqs;  // indexed by rail
  // Tells the transport that a QP of this connection on `rail` was renewed (healing): its
  // shared receive queue's completions name the new QPN from now on.
  std::function<void(int rail, uint32_t old_qpn, uint32_t new_qpn)> renumbered;
};

// Where one QP of a connection sits: this engine's rail, and the peer's rail it pairs with
// (EndpointRecord::kAnyRail on the connecting side until the acceptor chose).
struct LaneSpec {
  int rail = 0;
  int peer_rail = EndpointRecord::kAnyRail;
};

// wr_id layout: tag (24 bits) << 40 | qp index (7 bits) << 33 | is_recv << 32 | seq or slot.
inline uint64_t wr_prefix(uint32_t tag, int qp_index, bool recv) {
  return static_cast<uint64_t>(tag & 0xffffff) << 40 | static_cast<uint64_t>(qp_index) << 33 |
         static_cast<uint64_t>(recv ? 1 : 0) << 32;
}
inline uint32_t wr_tag(uint64_t wr_id) { return static_cast<uint32_t>(wr_id >> 40); }

class RdmaConnection : public Channel,
                       public GatherWrites,
                       public GatherReads,
                       public std::enable_shared_from_this<RdmaConnection> {
 public:
  enum class State { kPrepared, kConnected, kClosed };

  RdmaConnection(Transport& transport, const RdmaConnSettings& settings, RdmaShared shared,
                 uint32_t tag, const std::vector<LaneSpec>& lanes);
  ~RdmaConnection() override;

  // Set-up, on the thread that connects or accepts.
  EndpointRecord local_record() const;
  // Pairs every QP with one of the peer's (the connector drops those the acceptor left
  // unpaired), posts the control receives and brings the QPs to RTS.
  void connect_qps(const EndpointRecord& peer, bool acceptor);
  // Watches the bootstrap stream (`tls`: its TLS session, or null) for the peer's GOODBYE or
  // its end.
  void start(UniqueFd socket, std::unique_ptr<TlsSession> tls, std::string peer);
  uint32_t tag() const { return tag_; }

  RequestPtr post_write(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                        const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                        const TransferOptions& options) override;
  RequestPtr post_read(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                       const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                       const TransferOptions& options) override;
  void send_ctrl(const CtrlMessage& message, CtrlPayload payload) override;
  Grant grant(const std::shared_ptr<MemoryRegion>& local, uint64_t offset, uint64_t length,
              uint32_t value, const RequestPtr& progress) override;
  void release_grant(uint64_t id) override;
  void post_write_notify(const RequestPtr& request, const std::shared_ptr<MemoryRegion>& local,
                         uint64_t offset, uint64_t length, uint64_t addr, uint32_t key,
                         uint32_t route, uint32_t value, const TransferOptions& options) override;
  // GatherWrites and GatherReads: at most 64 pieces of at most 64 KiB each (rdma_gather.cc).
  Limits gather_limits(const MemoryRegion& local) const override;
  RequestPtr post_write_gather(const std::shared_ptr<MemoryRegion>& local,
                               const std::vector<GatherPiece>& pieces,
                               PieceFailed failed) override;
  GatherLimits read_gather_limits(const MemoryRegion& local) const override;
  RequestPtr post_read_gather(const std::shared_ptr<MemoryRegion>& local,
                              const std::vector<GatherPiece>& pieces,
                              PieceFailed failed) override;
  RequestPtr new_request(OpKind op, uint64_t bytes) override;
  ChannelLimits limits() const override;
  void check_open() const override;
  void close() override;
  // GOODBYE to the peer and the QPs to ERR; close() then waits (bounded) for the flushes.
  void begin_close() override;
  void abort(ErrorKind kind, const std::string& reason) override;
  bool is_closed() const override;
  std::string error() const override;
  std::string peer() const override;
  int streams() const override { return static_cast<int>(lanes_.size()); }
  std::string describe() const override;
  uint64_t outstanding_wrs() const;  // send-queue WRs on the device, all QPs
  uint64_t posted_receives() const;  // receive WRs on the device, all QPs (none on an SRQ)
  uint64_t own_receive_buffers() const;  // the QPs' own receive buffers (none on an SRQ)
  std::vector<std::pair<std::string, uint64_t>> attributes() const override;
  State state() const;

  // Every WR of the QPs completed or flushed (after teardown: nothing is on the device).
  bool drained() const;

  // The QPs, as (rail, QP number): the transport finds the connection of an SRQ receive by
  // its completion's qp_num.
  std::vector<std::pair<int, uint32_t>> qp_numbers() const;

  // Completion thread.
  void on_completion(const ibv_wc& wc);
  // A receive completion of `rail`'s SRQ on one of this connection's QPs (wc.qp_num), its bytes
  // in `data` (valid until this returns; the transport then reposts the buffer).
  void on_srq_completion(int rail, const ibv_wc& wc, const uint8_t* data);
  void on_socket_ready();
  void on_qp_event(uint32_t qp_num, const std::string& what);
  // The local rail `rail` failed (`cause` says how): failover, see above; the peer is told
  // (RAIL_DOWN, control_msg.h).
  void rail_down(int rail, const std::string& cause);
  // The device of `rail` is being removed (after rail_down): destroys this connection's QPs on
  // it and lets go of every handle it holds there; describe() shows it removed with `cause`.
  // Not on that rail's completion thread (the transport stops it first).
  void release_rail(int rail, const std::string& cause);
  // The transport's rail watch calls this every period (rdma_removal.cc): the connecting side
  // drives the healing of its failed rails from here (rdma_healing.cc).
  void heal_tick();
  // How many of this connection's QPs sit on `rail` (the room to reserve in its CqSet).
  int qps_on(int rail) const;
  // The device of `rail`, released, came back with the handles in `back` (rdma_transport.h);
  // `cq`: this connection's room on its CqSet. Each QP there is created again (new QPN, INIT)
  // with its send buffers registered in the new PD, and the rail heals at once (rdma_healing.cc:
  // the connector asks, the acceptor tells the connector to ask). False (nothing changed) when
  // the connection is closed or did not release the rail; throws Error when a QP or MR cannot
  // be made (the rail then stays released).
  bool rail_back(int rail, const Rail& back, std::shared_ptr<CompletionQueue> cq);

 private:
  // One QP with its buffers; members in destruction-safe order (the QP dies before its buffers).
  struct Lane {
    int rail = 0;
    int peer_rail = 0;
    QpAddress peer;                // the peer's QP as connect_qps brought ours up to it
    ibv_mtu mtu = IBV_MTU_1024;    // the path MTU it was brought up with
    std::unique_ptr<BufferSlab> recv_slab;  // null on a rail with an SRQ
    std::unique_ptr<BufferSlab> send_slab;
    std::unique_ptr<QueuePair> qp;
    std::unique_ptr<SendQueue> sq;
  };
  // A gathered group in flight: whom to tell which pieces failed, and how many it has.
  struct PendingGather {
    PieceFailed failed;
    uint32_t pieces = 0;
  };
  // What a grant holds until released (or, after teardown, until the flushes are drained).
  struct GrantHold {
    RegionUse hold;
    std::unique_ptr<VerbsMr> temp_mr;  // REMOTE_WRITE over the destination, when needed
    uint32_t value = 0;                // the IMM the peer's last WRITE carries
    uint64_t length = 0;               // bytes the peer writes (counted on landing)
  };

  // A request of this connection; waiting on it drives the CQ (caller-driven progress).
  void check_open_locked() const;
  void check_remote(const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                    const char* what) const;
  // post_write_gather and post_read_gather (rdma_gather.cc).
  RequestPtr post_gather(OpKind op, const std::shared_ptr<MemoryRegion>& local,
                         const std::vector<GatherPiece>& pieces, PieceFailed failed);
  RequestPtr post_one_sided(OpKind op, const std::shared_ptr<MemoryRegion>& local,
                            uint64_t local_offset, const Descriptor& remote,
                            uint64_t remote_offset, uint64_t length,
                            const TransferOptions& options);
  // A WRITE into a grant of the peer's (post_write_notify): every WR on one QP paired with the
  // peer's rail `grant_rail`, where the grant's rkey is valid, the last a WRITE_WITH_IMM of
  // `imm` (RC delivers them in order).
  struct Notified {
    bool with_imm = false;
    uint32_t imm = 0;
    int grant_rail = -1;
  };
  // Registers `req` as active and posts its WRs: striped over the lanes, or (notified) as
  // Notified says. `remote_keys`: the remote region's rkey on each peer rail (notified: the
  // grant's, alone).
  void post_chunks(OpKind op, const RequestPtr& req, const std::shared_ptr<MemoryRegion>& local,
                   uint64_t local_offset, uint64_t remote_addr,
                   std::shared_ptr<const std::vector<uint32_t>> remote_keys, uint64_t length,
                   const Notified& notified, const TransferOptions& options);
  // The control lane and its rail (see above).
  int ctrl_lane() const { return ctrl_lane_.load(); }
  int ctrl_rail() const { return lanes_[static_cast<size_t>(ctrl_lane())].rail; }
  // A receive arrived on `lane`: the peer moved its control lane there when it is later than
  // ours (and live): ours follows, and our rail of the old control lane fails over too (the
  // peer moves its control lane only when its side of that rail failed; a deleted device
  // leaves our side's port up, so nothing else would tell us before the retries run out).
  void follow_ctrl_lane(int lane);
  // The peer's side of its rail `peer_rail` failed (its RAIL_DOWN, `cause` its text): our lanes
  // paired with it fail over, without telling the peer back.
  void peer_rail_down(int peer_rail, const std::string& cause);
  // Failover of the live lanes on our rail `rail` or paired with the peer's rail `peer_rail`
  // (-1: none): they go to ERR and their chunks move to the live lanes; a local rail left with
  // no live lane fails with `cause`. `tell_peer`: `cause` is our own finding on `rail` (it
  // replaces a cause the peer reported) and a RAIL_DOWN for `rail` goes to the peer.
  void fail_over(int rail, int peer_rail, const std::string& cause, bool tell_peer);
  // Healing a failed rail (rdma_healing.cc): the control messages of each side, a completion
  // on a lane being healed, an attempt that failed (its lanes back to ERR, the next one after
  // the backoff) and, when a rail fails, when to try first.
  void on_rejoin(const CtrlMessage& m);
  void on_rejoin_ack(const CtrlMessage& m);
  void on_rejoin_nak(const CtrlMessage& m);
  void on_rail_up(const CtrlMessage& m);
  void on_rail_back(const CtrlMessage& m);
  void on_heal_completion(int lane, const ibv_wc& wc);
  void heal_failed(size_t rail, uint64_t attempt, const std::string& why, bool for_good);
  void schedule_heal_locked(size_t rail);
  // A new QP for `lane` in INIT (QueuePair::renew), its send queue revived, the transport told
  // its new QPN. Under setup_mu_.
  void renew(Lane& lane);
  // Whether a lane on a rail other than `rail` is live (a failure on `rail` can then fail over).
  bool other_rail_up(int rail) const;
  // Why `rail`'s port is not ACTIVE now ("" when it is, or its device was released).
  std::string port_not_active(int rail) const;
  // Live lanes whose peer rail has a key in `keys` (null: the live lanes paired with the
  // peer's rail `peer_rail`) and, with `local`, whose rail has an MR of that memory (GPU memory
  // has none on a rail whose device came back).
  std::vector<int> usable_lanes(const std::vector<uint32_t>* keys, int peer_rail = -1,
                                const MemoryRegion* local = nullptr) const;
  // The remote region's rkey on each peer rail, 0 where it has none or where the descriptor is
  // older than that rail's return (its generation below the rail's, endpoint_record.h).
  std::shared_ptr<std::vector<uint32_t>> remote_keys(const Descriptor& remote) const;
  int least_loaded(const std::vector<int>& among) const;
  // Per rail of the engine, the rate striping counts with for `rails` (bytes/s; rail_meter.h:
  // the measured rate, or a stand-in until it is measured).
  std::vector<double> rail_rates(const std::vector<int>& rails) const;
  // The rail a transfer that is not striped goes on, among the live `rails` (two or more).
  int single_rail(const std::vector<int>& rails, const std::shared_ptr<MemoryRegion>& local,
                  uint64_t length) const;
  uint64_t max_chunk() const;
  // Posts on a lane; a failed ibv_post_send aborts the connection; works a failed-over lane
  // refuses move to the live rails.
  void submit(int lane, std::vector<SendWork> works);
  // Failover: posts `works` (chunks of a failed rail) on the live lanes.
  void repost(std::vector<SendWork> works);
  std::string rail_name(int rail) const;
  std::vector<int> used_rails() const;  // the rails of the lanes, in lane order
  // The completion thread of `rail` (null once its device is released).
  std::shared_ptr<CqPoller> poller_of(int rail) const;
  void post_recv_slot(int lane, uint32_t slot);
  // A completion of `lane`; `srq_data`: an SRQ receive's buffer (null: a send WR or a receive
  // of the QP's own).
  void complete(int lane, bool is_recv, const ibv_wc& wc, const uint8_t* srq_data);
  void on_recv(int lane, const ibv_wc& wc, const uint8_t* srq_data);
  void finish_parts(const std::vector<RequestPtr>& parts);
  // Closes the connection once (QPs to ERR, bootstrap socket closed); settles `culprit` first
  // (`settle` when given, else it fails with `culprit_error`) and fails every other pending
  // request with `why`. Logs the cause at `level`.
  void teardown(const Error& why, const RequestPtr& culprit, const Error& culprit_error,
                log::Level level, const std::function<void()>& settle = nullptr);
  // `piece`: the failed WR's index in its gathered group (when `request` is one).
  void fail_from_completion(const ibv_wc& wc, const RequestPtr& request, const std::string& op,
                            uint32_t piece = 0);
  // When `request` is a gathered group in flight: takes it off the books and returns how to
  // settle it (see above: `piece` fails with `own`, the later ones with `why`, then it
  // completes); else null.
  std::function<void()> settle_gather(const RequestPtr& request, uint32_t piece, const Error& own,
                                      const Error& why);
  // After teardown: releases what the flushed WRs used once drained(); true when drained.
  bool release_if_drained();
  // Waits (bounded) for drained(), polling the CQ from this thread when it can.
  void wait_drained(double timeout_s);

  Transport& transport_;
  const RdmaConnSettings settings_;
  RdmaShared shared_;  // a rail's handles in it are reset (under mu_) by release_rail
  const uint32_t tag_;
  std::vector<Lane> lanes_;
  // The bootstrap socket (liveness and GOODBYE). Closed as soon as the connection closes;
  // socket_mu_ orders that close against the poller thread's recv on it.
  std::mutex socket_mu_;
  UniqueFd socket_;
  std::unique_ptr<TlsSession> socket_tls_;  // socket_'s TLS session (TLS on), else null
  std::shared_ptr<CqPoller> socket_poller_;  // the one watching socket_ (the control rail's)
  uint64_t max_chunk_ = 0;
  uint32_t peer_ctrl_size_ = 0;
  // Negotiated with the peer's endpoint record in connect_qps (see endpoint_record.h).
  struct Negotiated {
    int path_mtu = 0;  // bytes
    uint8_t max_rd_atomic = 0;
    uint8_t max_dest_rd_atomic = 0;
  } negotiated_;

  std::mutex setup_mu_;  // connect_qps against release_rail (both change the lanes' QPs)
  mutable std::mutex mu_;
  State state_ = State::kPrepared;
  // The teardown that closed the connection failed every request it held (close() waits for
  // it when another thread began it).
  bool torn_down_ = false;
  std::string peer_;
  ErrorKind error_kind_ = ErrorKind::kClosed;
  std::string error_;
  std::unordered_map<uint64_t, RequestPtr> active_;  // one-sided ops and write_notify data
  std::unordered_map<uint64_t, PendingGather> gathers_;  // by request id; also in active_
  // Per local rail (index as in shared_.rails): up, why it failed, and bytes it carried.
  std::vector<bool> rail_up_;
  std::vector<bool> rail_released_;  // its device removed: release_rail() gave it all back
  std::vector<std::string> rail_cause_;
  // Its cause is the peer's report (RAIL_DOWN): a local cause found later replaces it.
  std::vector<bool> rail_by_peer_;
  // Per lane: live (false once its rail, or the peer's rail it pairs with, failed over).
  std::vector<bool> lane_up_;
  // Per lane: its QP was reset to rejoin (not live yet: only the probe goes on it).
  std::vector<bool> healing_;
  // Per local rail, the healing of its lanes once failed (rdma_healing.cc; under mu_).
  struct Heal {
    enum class Step { kIdle, kAsked, kProbing };
    Step step = Step::kIdle;
    uint64_t attempt = 0;
    double backoff_s = 0;
    std::chrono::steady_clock::time_point next_try{};
    std::chrono::steady_clock::time_point deadline{};
    std::chrono::steady_clock::time_point healed_at{};
    std::vector<size_t> lanes;  // of the attempt under way
    RequestPtr probe;           // its probe WRITEs, one part per lane
    uint64_t rejoins = 0;
    std::string never;          // why it will not heal (the peer's device removed, ...)
  };
  std::vector<Heal> heals_;
  // Per peer rail: its generation (endpoint_record.h), from its record and its REJOIN or
  // REJOIN_ACK after its device came back (under mu_).
  std::vector<uint16_t> peer_generation_;
  bool acceptor_ = false;
  std::unique_ptr<std::atomic<uint64_t>[]> rail_bytes_;
  RailMeter meter_;  // per local rail: measured rate, bytes outstanding, last striped share
  // RDMAXFER_RDMA_TEST_QP_ERR (tests only, rdma_connection.cc): the rail whose QP is moved to
  // ERR once it carried test_err_bytes_ (-1: none), and whether that happened.
  int test_err_rail_ = -1;
  uint64_t test_err_bytes_ = 0;
  std::atomic<bool> test_err_done_{false};
  uint32_t window_ = 1;  // the credit window the peer's receive buffers allow
  std::atomic<uint64_t> ctrl_seq_{0};  // the number of our last control SEND (control_msg.h)
  CtrlSeqFilter ctrl_seen_;            // the peer's control SEND numbers handed up (under mu_)
  std::atomic<uint64_t> ctrl_repeats_{0};  // the peer's control SENDs that came again, dropped
  // RDMAXFER_RDMA_TEST_CTRL_TWICE=1 (tests only, rdma_messages.cc): every control SEND is
  // posted twice with its number, as a SEND whose ACK was lost is sent again after a failover.
  bool test_ctrl_twice_ = false;
  std::atomic<int> ctrl_lane_{0};
  std::unordered_map<uint64_t, GrantHold> grants_;
  uint64_t next_grant_ = 1;
  // Receive WRs posted per QP (completions, flushes included, take them back).
  std::unique_ptr<std::atomic<int>[]> posted_recvs_;
  // Held from teardown until the flushes are drained: what in-flight WRs may still touch.
  std::vector<std::unique_ptr<VerbsMr>> draining_mrs_;
  std::vector<RegionUse> draining_holds_;
  std::mutex drain_mu_;
  std::condition_variable drain_cv_;
};

}  // namespace rdmaxfer
