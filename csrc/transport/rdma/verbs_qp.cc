#include "transport/rdma/verbs_qp.h"

#include <cerrno>
#include <random>

#include "common/error.h"

namespace rdmaxfer {

namespace {
// Local ACK timeout 4.096 us * 2^kTimeout (~268 ms) and 7 retries: a dead peer is noticed by
// the QP within ~2 s; the bootstrap socket usually reports it sooner.
constexpr uint8_t kTimeout = 16;
constexpr uint8_t kRetryCount = 7;
}  // namespace

QueuePair::QueuePair(std::shared_ptr<ProtectionDomain> pd, std::shared_ptr<CompletionQueue> cq,
                     const QpLimits& limits, uintptr_t tag,
                     std::shared_ptr<SharedReceiveQueue> srq)
    : pd_(std::move(pd)), cq_(std::move(cq)), srq_(std::move(srq)), limits_(limits), tag_(tag) {
  asked_inline_ = limits_.max_inline;
  create_locked();
}

void QueuePair::create_locked() {
  ibv_qp_init_attr init{};
  init.qp_context = reinterpret_cast<void*>(tag_);
  init.send_cq = cq_->get();
  init.recv_cq = cq_->get();
  init.cap.max_send_wr = limits_.sq_depth;
  init.cap.max_recv_wr = srq_ ? 0 : limits_.rq_depth;
  init.srq = srq_ ? srq_->get() : nullptr;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;  // selective signaling
  init.cap.max_inline_data = asked_inline_;
  qp_ = verbs().create_qp(pd_->get(), &init);
  if (qp_ == nullptr && asked_inline_ > 0) {
    init.cap.max_inline_data = 0;  // a provider without inline data: plain WRs only
    qp_ = verbs().create_qp(pd_->get(), &init);
  }
  if (qp_ != nullptr) {
    limits_.max_inline = init.cap.max_inline_data;  // what was granted
    qp_num_.store(qp_->qp_num);
  }
  on_srq_ = srq_ != nullptr;
  if (qp_ == nullptr) {
    throw_verbs("ibv_create_qp(RC, " + std::to_string(limits_.sq_depth) + " send / " +
                    (srq_ ? std::string("SRQ") : std::to_string(limits_.rq_depth)) +
                    " receive WRs)",
                errno);
  }
  std::random_device rd;
  psn_ = rd() & 0xffffff;
}

void QueuePair::recreate(std::shared_ptr<ProtectionDomain> pd,
                         std::shared_ptr<CompletionQueue> cq,
                         std::shared_ptr<SharedReceiveQueue> srq) {
  std::lock_guard<std::mutex> lock(mu_);
  if (qp_ != nullptr) {
    throw Error(ErrorKind::kInvalidArgument,
                "QP " + std::to_string(qp_num_.load()) + " is not destroyed: nothing to recreate");
  }
  pd_ = std::move(pd);
  cq_ = std::move(cq);
  srq_ = std::move(srq);
  try {
    create_locked();
  } catch (...) {
    srq_.reset();
    cq_.reset();
    pd_.reset();
    throw;
  }
  init_locked();
}

QueuePair::~QueuePair() {
  if (qp_ != nullptr) verbs().destroy_qp(qp_);
}

void QueuePair::to_init() {
  std::lock_guard<std::mutex> lock(mu_);
  check_live();
  init_locked();
}

void QueuePair::renew() {
  std::lock_guard<std::mutex> lock(mu_);
  check_live();
  const int rc = verbs().destroy_qp(qp_);
  if (rc != 0) throw_verbs("ibv_destroy_qp(QP " + std::to_string(qp_num_.load()) + ")", rc);
  qp_ = nullptr;
  create_locked();  // a new QPN and PSN; throws (leaving no QP) when the device refuses
  init_locked();
}

void QueuePair::init_locked() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = pd_->context().port();
  attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  const int rc = verbs().modify_qp(
      qp_, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) throw_verbs("ibv_modify_qp(RESET -> INIT)", rc);
}

void QueuePair::to_rtr(const QpAddress& peer, ibv_mtu path_mtu, uint8_t max_dest_rd_atomic) {
  std::lock_guard<std::mutex> lock(mu_);
  check_live();
  const DeviceContext& dc = pd_->context();
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = path_mtu;
  attr.dest_qp_num = peer.qpn;
  attr.rq_psn = peer.psn;
  attr.max_dest_rd_atomic = max_dest_rd_atomic;
  attr.min_rnr_timer = limits_.fabric.min_rnr_timer;
  attr.ah_attr.is_global = 0;
  attr.ah_attr.dlid = peer.lid;
  attr.ah_attr.sl = limits_.fabric.service_level;
  attr.ah_attr.src_path_bits = 0;
  attr.ah_attr.port_num = dc.port();
  if (dc.ethernet()) {
    attr.ah_attr.is_global = 1;
    attr.ah_attr.grh.dgid = peer.gid;
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(dc.gid_index());
    attr.ah_attr.grh.hop_limit = 64;
    attr.ah_attr.grh.traffic_class = limits_.fabric.traffic_class;
    attr.ah_attr.grh.flow_label = 0;
  }
  const int rc = verbs().modify_qp(qp_, &attr,
                                   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                       IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) {
    throw_verbs("ibv_modify_qp(INIT -> RTR, peer QPN " + std::to_string(peer.qpn) +
                    (dc.ethernet() ? ", GID index " + std::to_string(dc.gid_index()) : "") +
                    "; is the peer's address routable from " + dc.name() + "?)",
                rc);
  }
  const uint8_t tclass = attr.ah_attr.is_global ? attr.ah_attr.grh.traffic_class : uint8_t{0};
  applied_ = {attr.ah_attr.sl, tclass, attr.min_rnr_timer};
}

void QueuePair::to_rts(uint8_t max_rd_atomic) {
  std::lock_guard<std::mutex> lock(mu_);
  check_live();
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = kTimeout;
  attr.retry_cnt = kRetryCount;
  attr.rnr_retry = kRnrRetries;
  attr.sq_psn = psn_;
  attr.max_rd_atomic = max_rd_atomic;
  const int rc = verbs().modify_qp(qp_, &attr,
                                   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                       IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                       IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) throw_verbs("ibv_modify_qp(RTR -> RTS)", rc);
}

FabricSettings QueuePair::query_fabric() const {
  std::lock_guard<std::mutex> lock(mu_);
  check_live();
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  const int rc = verbs().query_qp(qp_, &attr, IBV_QP_AV | IBV_QP_MIN_RNR_TIMER, &init);
  if (rc != 0) throw_verbs("ibv_query_qp", rc);
  FabricSettings s;
  s.service_level = attr.ah_attr.sl;
  s.traffic_class = attr.ah_attr.grh.traffic_class;
  s.min_rnr_timer = attr.min_rnr_timer;
  return s;
}

void QueuePair::to_error() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (qp_ == nullptr) return;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  verbs().modify_qp(qp_, &attr, IBV_QP_STATE);
}

void QueuePair::check_live() const {
  if (qp_ == nullptr) {
    throw Error(ErrorKind::kConnection, "QP " + std::to_string(qp_num_.load()) +
                                            " was destroyed with its device (rail removed)");
  }
}

void QueuePair::destroy() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (qp_ != nullptr) verbs().destroy_qp(qp_);  // best effort: the device is going away
  qp_ = nullptr;
  srq_.reset();
  cq_.reset();
  pd_.reset();
}

bool QueuePair::destroyed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return qp_ == nullptr;
}

}  // namespace rdmaxfer
