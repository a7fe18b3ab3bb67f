// A reliable-connected queue pair, brought up in rc_pingpong's order.
//
// Lifecycle (the state is in the method names):
//   created (RESET, on the engine's PD, sends and receives completing on one CQ; inline data
//                           up to limits.max_inline asked for, granted size in limits())
//   -> to_init()            port, pkey 0, remote READ/WRITE allowed (the MRs decide)
//   -> receives posted      (allowed from INIT on, so nothing the peer sends is lost; none
//                           for a QP on a shared receive queue, verbs_srq.h, whose receives
//                           are posted already)
//   -> to_rtr(peer)         path MTU, peer QPN/PSN, address (GRH with the peer's GID and
//                           limits.fabric's traffic class on RoCE, the peer's LID on
//                           InfiniBand; limits.fabric's SL), min_rnr_timer (limits.fabric),
//                           max_dest_rd_atomic (negotiated)
//   -> to_rts()             timeouts, retry counts (rnr_retry finite), our PSN, max_rd_atomic
//                           (negotiated): can post sends
//   -> to_error()           on teardown: every outstanding WR is flushed
//   -> renew()              a failed rail healing: the QP destroyed and a new one (new QPN and
//                           PSN, the same PD, CQ and SRQ) made in INIT; to_rtr and
//                           to_rts follow again (rdma_healing.cc)
//   -> ibv_destroy_qp       on destruction, before the CQ and the buffers its WRs used, or
//                           earlier by destroy() (its device is being removed: the QP lets
//                           go of its PD, CQ and SRQ; to_error() is then a no-op).
//   -> recreate(...)        after destroy(), its device back: a new QP (new QPN and PSN) on
//                           the new PD, CQ and SRQ, in INIT (rdma_healing.cc).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "transport/rdma/fabric_settings.h"
#include "transport/rdma/verbs_cq.h"
#include "transport/rdma/verbs_pd.h"
#include "transport/rdma/verbs_srq.h"

namespace rdmaxfer {

// What one side of a connection tells the other about one of its QPs (see endpoint_record.h).
struct QpAddress {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint16_t lid = 0;
  ibv_gid gid{};
};

// Receiver-not-ready retries of every QP (finite: 7 would mean forever). Control traffic is
// flow-controlled by credits (rdma_connection.h), so an RNR NAK only means a peer that stopped
// reposting its receive buffers; after these retries the send fails with
// IBV_WC_RNR_RETRY_EXC_ERR.
constexpr uint8_t kRnrRetries = 6;

struct QpLimits {
  uint32_t sq_depth = 128;
  uint32_t rq_depth = 32;
  // This side's RDMA READ depths (device maxima, clamped to 1..16); a connection uses the
  // minimum of each with the peer's opposite number (see to_rtr / to_rts).
  uint8_t initiator_depth = 16;      // READs this QP may have outstanding (max_qp_init_rd_atom)
  uint8_t responder_resources = 16;  // READs this QP serves at once (max_qp_rd_atom)
  // Bytes a WR may carry inside itself (IBV_SEND_INLINE): asked for at creation, then what the
  // provider granted (0 when it refused inline data).
  uint32_t max_inline = 256;
  // Service level, traffic class (to_rtr's address) and min_rnr_timer (fabric_settings.h).
  FabricSettings fabric;
};

class QueuePair {
 public:
  // `tag` lands in qp_context, so async events name the connection without a pointer. With
  // `srq`, the QP takes its receives from that SRQ (and has no receive queue of its own); it
  // holds the SRQ, which is destroyed only after its last QP.
  QueuePair(std::shared_ptr<ProtectionDomain> pd, std::shared_ptr<CompletionQueue> cq,
            const QpLimits& limits, uintptr_t tag,
            std::shared_ptr<SharedReceiveQueue> srq = nullptr);
  ~QueuePair();
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  ibv_qp* get() const { return qp_; }
  uint32_t qp_num() const { return qp_num_.load(); }
  uint32_t psn() const { return psn_; }
  const QpLimits& limits() const { return limits_; }
  bool on_srq() const { return on_srq_; }

  void to_init();
  // max_dest_rd_atomic: READs served at once = min(our responder resources, the peer's
  // initiator depth). max_rd_atomic: READs outstanding = min(our initiator depth, the peer's
  // responder resources).
  void to_rtr(const QpAddress& peer, ibv_mtu path_mtu, uint8_t max_dest_rd_atomic);
  void to_rts(uint8_t max_rd_atomic);
  // Best effort (teardown path): never throws.
  void to_error() noexcept;
  // A failed rail healing (rdma_healing.cc): the QP is destroyed and a new one made on the same
  // PD, CQ and SRQ, in INIT, with a new QPN (qp_num()) and a new random PSN (psn()); to_rtr /
  // to_rts follow as at set-up. A QP reset in place instead (ERR -> RESET -> INIT) kept state
  // of its last life on rxe (Linux 6.1): after a rejoin its first multi-packet WRITE was
  // flushed, rejoin after rejoin. Every WR it held is gone: the send queue's owner drops them
  // (SendQueue::revive); completions of the old QP still in the CQ carry its old QPN.
  void renew();
  // ibv_destroy_qp now (idempotent; the QP must be in ERR and its send queue dead: nothing
  // posts on it again) and lets go of the PD, CQ and SRQ, so its device can be released.
  void destroy() noexcept;
  bool destroyed() const;
  // A destroyed QP's device came back: ibv_create_qp on `pd` / `cq` / `srq` with the same
  // limits and tag, then INIT (new QPN, new PSN). Throws Error(kInvalidArgument) when the QP is
  // not destroyed, Error(kConnection) when ibv_create_qp or ibv_modify_qp fails.
  void recreate(std::shared_ptr<ProtectionDomain> pd, std::shared_ptr<CompletionQueue> cq,
                std::shared_ptr<SharedReceiveQueue> srq);
  // The fabric settings the QP holds, read back with ibv_query_qp (after to_rtr); throws on
  // failure (Error kConnection after destroy(), as are the to_* transitions). Providers differ in what they report: rxe keeps no SL for RoCE (reads back 0).
  FabricSettings query_fabric() const;
  // The fabric settings to_rtr gave ibv_modify_qp (zero before to_rtr). The traffic class is
  // 0 where the address carries no GRH (InfiniBand inside a subnet).
  const FabricSettings& applied_fabric() const { return applied_; }

 private:
  void check_live() const;  // mu_ held
  void init_locked();       // RESET -> INIT; mu_ held
  void create_locked();     // ibv_create_qp on pd_, cq_, srq_, and a new PSN; mu_ held
  std::shared_ptr<ProtectionDomain> pd_;
  std::shared_ptr<CompletionQueue> cq_;
  std::shared_ptr<SharedReceiveQueue> srq_;  // declared before qp_: outlives it
  QpLimits limits_;
  bool on_srq_ = false;
  uintptr_t tag_ = 0;
  uint32_t asked_inline_ = 0;  // limits.max_inline as asked for (limits_ holds what was granted)
  mutable std::mutex mu_;  // destroy() against to_error() and query_fabric() on other threads
  ibv_qp* qp_ = nullptr;
  std::atomic<uint32_t> qp_num_{0};  // read by completion threads of other rails
  uint32_t psn_ = 0;
  FabricSettings applied_{0, 0, 0};
};

}  // namespace rdmaxfer
