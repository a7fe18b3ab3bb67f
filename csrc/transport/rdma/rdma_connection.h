// A connection to one peer over one or more RC QPs (the verbs Connection).
//
// Lifecycle (explicit state, see State):
//   kPrepared   constructed by the transport: QPs created and in INIT, control receive buffers
//               posted; local_record() describes them for the peer.
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
//                   ports) and spread over the QPs; done when every chunk's WR completed.
//   SEND / RECV     two-sided, see control_msg.h: EAGER (data inside the SEND, done at CTS) or
//                   RTS -> header to the receiver -> post_recv places a buffer (a temporary MR
//                   with REMOTE_WRITE over it if its region lacks that access) -> CTS with its
//                   address and rkey -> the sender RDMA-WRITEs the chunks on one QP, the last as
//                   WRITE_WITH_IMM (imm = low 32 bits of the message id), whose receive
//                   completion completes the RECV. REJECT fails the sender with kProtocol.
// Flow control: messages are credited. A sender announces (RTS or EAGER) at most `window`
// messages that the receiver has not answered yet (window = the peer's ctrl_depth / 4, from its
// endpoint record); a message holds its credit until its send is terminal (CTS of an EAGER, the
// WRITE_WITH_IMM's completion, or REJECT). Later sends wait in this process, in order, as
// headers only (no payload copy), bounded by their caller's timeout. So a receiver that never
// calls recv holds at most `window` announced messages (and at most `window` EAGER payloads) per
// connection, and every control SEND (RTS/EAGER, CTS/REJECT answering the peer's credited
// messages) and WRITE_WITH_IMM lands in a receive buffer that is there: each QP keeps
// `ctrl_depth` of them posted, reposted as soon as they are consumed. rnr_retry is finite
// (kRnrRetries): an RNR NAK means a peer that stopped reposting, and the send fails with
// IBV_WC_RNR_RETRY_EXC_ERR saying so.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/unique_fd.h"
#include "engine/message_inbox.h"
#include "transport/rdma/buffer_slab.h"
#include "transport/rdma/control_msg.h"
#include "transport/rdma/cq_poller.h"
#include "transport/rdma/endpoint_record.h"
#include "transport/rdma/send_queue.h"
#include "transport/rdma/verbs_mr.h"
#include "transport/rdma/verbs_qp.h"
#include "transport/transport.h"

namespace rdmaxfer {

struct RdmaConnSettings {
  uint64_t eager_limit = 8192;
  uint32_t ctrl_size = 16384;   // bytes per control buffer (largest control SEND)
  uint32_t ctrl_depth = 32;     // receive buffers per QP
  uint32_t ctrl_slots = 16;     // control send slots per QP
  QpLimits limits;
  uint64_t max_message = 1ull << 30;  // local port's max_msg_sz
};

// What every connection of one transport shares; held by shared_ptr so it outlives them all.
struct RdmaShared {
  std::shared_ptr<ProtectionDomain> pd;
  std::shared_ptr<CompletionQueue> cq;
  std::shared_ptr<CqPoller> poller;
};

// wr_id layout: tag (24 bits) << 40 | qp index (7 bits) << 33 | is_recv << 32 | seq or slot.
inline uint64_t wr_prefix(uint32_t tag, int qp_index, bool recv) {
  return static_cast<uint64_t>(tag & 0xffffff) << 40 | static_cast<uint64_t>(qp_index) << 33 |
         static_cast<uint64_t>(recv ? 1 : 0) << 32;
}
inline uint32_t wr_tag(uint64_t wr_id) { return static_cast<uint32_t>(wr_id >> 40); }

class RdmaConnection : public Connection, public std::enable_shared_from_this<RdmaConnection> {
 public:
  enum class State { kPrepared, kConnected, kClosed };

  RdmaConnection(Transport& transport, const RdmaConnSettings& settings, RdmaShared shared,
                 uint32_t tag, int n_qps);
  ~RdmaConnection() override;

  // Set-up, on the thread that connects or accepts.
  EndpointRecord local_record() const;
  void connect_qps(const EndpointRecord& peer);
  void start(UniqueFd socket, std::string peer);
  uint32_t tag() const { return tag_; }

  RequestPtr post_write(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                        const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                        const TransferOptions& options) override;
  // WRITE whose last WR carries `imm` (WRITE_WITH_IMM): the peer's QP consumes a receive.
  RequestPtr post_write_imm(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                            const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                            uint32_t imm, const TransferOptions& options);
  RequestPtr post_read(const std::shared_ptr<MemoryRegion>& local, uint64_t local_offset,
                       const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                       const TransferOptions& options) override;
  RequestPtr post_send(const std::shared_ptr<MemoryRegion>& local, uint64_t offset,
                       uint64_t length, const std::string& meta,
                       const TransferOptions& options) override;
  RequestPtr post_recv_header() override;
  RequestPtr post_recv(uint64_t msg_id, const std::shared_ptr<MemoryRegion>& local,
                       uint64_t offset, uint64_t length) override;
  void reject(uint64_t msg_id, const std::string& reason) override;
  bool cancel_recv_header(const RequestPtr& request) override;
  void close() override;
  void abort(ErrorKind kind, const std::string& reason) override;
  bool is_closed() const override;
  std::string error() const override;
  std::string peer() const override;
  int streams() const override { return static_cast<int>(lanes_.size()); }
  std::string describe() const override;
  uint64_t waiting_size() const;
  uint64_t announced_size() const;
  uint64_t outstanding_wrs() const;  // send-queue WRs on the device, all QPs
  uint64_t posted_receives() const;  // receive WRs on the device, all QPs
  std::vector<std::pair<std::string, uint64_t>> attributes() const override;
  State state() const;

  // Every WR of the QPs completed or flushed (after teardown: nothing is on the device).
  bool drained() const;

  // Completion thread.
  void on_completion(const ibv_wc& wc);
  void on_socket_ready();
  void on_qp_event(const std::string& what);

 private:
  // One QP with its buffers; members in destruction-safe order (the QP dies before its buffers).
  struct Lane {
    std::unique_ptr<BufferSlab> recv_slab;
    std::unique_ptr<BufferSlab> send_slab;
    std::unique_ptr<QueuePair> qp;
    std::unique_ptr<SendQueue> sq;
  };
  struct PendingSend {
    RequestPtr request;
    std::shared_ptr<MemoryRegion> region;
    uint64_t offset = 0;
    uint64_t length = 0;
    TransferOptions options;
    bool eager = false;
    std::string meta;  // until announced
  };
  struct PendingRecv {
    RequestPtr request;
    RegionUse hold;
    std::unique_ptr<VerbsMr> temp_mr;  // REMOTE_WRITE over the destination, when needed
  };

  // A request of this connection, counted in its stats as `kind`; waiting on it drives the CQ
  // (caller-driven progress).
  RequestPtr new_request(OpKind op, uint64_t bytes, const char* kind);
  void check_open_locked() const;
  void check_remote(const Descriptor& remote, uint64_t remote_offset, uint64_t length,
                    const char* what) const;
  RequestPtr post_one_sided(OpKind op, const std::shared_ptr<MemoryRegion>& local,
                            uint64_t local_offset, const Descriptor& remote,
                            uint64_t remote_offset, uint64_t length, bool with_imm,
                            uint32_t imm, const TransferOptions& options);
  int least_loaded(int among) const;
  uint64_t max_chunk() const;
  // Posts on a lane; a failed ibv_post_send aborts the connection.
  void submit(int lane, std::vector<SendWork> works);
  void send_ctrl(const CtrlHeader& header, const std::string& meta, const uint8_t* data,
                 size_t data_len);
  void post_recv_slot(int lane, uint32_t slot);
  void on_recv(int lane, const ibv_wc& wc);
  void on_ctrl(const CtrlHeader& h, std::string meta, std::string data);
  void start_rendezvous(PendingSend send, uint64_t addr, uint32_t rkey);
  // Sends the RTS or EAGER of a message that holds a credit.
  void announce(uint64_t msg_id);
  // A message's send is terminal: its credit goes to the next waiting message, if any.
  void release_credit();
  void finish_parts(const std::vector<RequestPtr>& parts);
  // Closes the connection once (QPs to ERR, bootstrap socket closed); fails `culprit` with its
  // own error first and every other pending request with `why`; logs the cause at `level`.
  void teardown(const Error& why, const RequestPtr& culprit, const Error& culprit_error,
                log::Level level);
  void fail_from_completion(const ibv_wc& wc, const RequestPtr& request, const std::string& op);
  // After teardown: releases what the flushed WRs used once drained(); true when drained.
  bool release_if_drained();
  // Waits (bounded) for drained(), polling the CQ from this thread when it can.
  void wait_drained(double timeout_s);

  Transport& transport_;
  const RdmaConnSettings settings_;
  RdmaShared shared_;
  const uint32_t tag_;
  std::vector<Lane> lanes_;
  // The bootstrap socket (liveness and GOODBYE). Closed as soon as the connection closes;
  // socket_mu_ orders that close against the poller thread's recv on it.
  std::mutex socket_mu_;
  UniqueFd socket_;
  uint64_t max_chunk_ = 0;
  uint32_t peer_ctrl_size_ = 0;
  // Negotiated with the peer's endpoint record in connect_qps (see endpoint_record.h).
  struct Negotiated {
    int path_mtu = 0;  // bytes
    uint8_t max_rd_atomic = 0;
    uint8_t max_dest_rd_atomic = 0;
  } negotiated_;

  mutable std::mutex mu_;
  State state_ = State::kPrepared;
  std::string peer_;
  ErrorKind error_kind_ = ErrorKind::kClosed;
  std::string error_;
  std::unordered_map<uint64_t, RequestPtr> active_;  // one-sided ops and rendezvous data
  std::unordered_map<uint64_t, PendingSend> sends_;  // waiting for credit, CTS or REJECT
  uint32_t window_ = 1;       // credits: messages announced and not yet answered, at most
  uint32_t credits_used_ = 0;
  std::deque<uint64_t> waiting_;  // sends (by msg id) waiting for a credit, in post order
  MessageInbox inbox_;
  std::unordered_map<uint64_t, PendingRecv> recvs_;     // by msg id
  std::unordered_map<uint32_t, uint64_t> recv_by_imm_;  // low 32 bits -> msg id
  // Receive WRs posted per QP (completions, flushes included, take them back).
  std::unique_ptr<std::atomic<int>[]> posted_recvs_;
  // Held from teardown until the flushes are drained: what in-flight WRs may still touch.
  std::vector<std::unique_ptr<VerbsMr>> draining_mrs_;
  std::vector<RegionUse> draining_holds_;
  std::mutex drain_mu_;
  std::condition_variable drain_cv_;
};

}  // namespace rdmaxfer
