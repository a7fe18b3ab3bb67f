// RdmaConnection: its work completions (from the rails' CQ pollers, rdma_transport.h): WRs
// retired from the send queues, receives carried up, and a failed completion turned into a rail
// failover or the connection's teardown with the precise error.
#include <cstdio>
#include <string>
#include <vector>

#include "common/error.h"
#include "transport/rdma/rdma_connection.h"

namespace rdmaxfer {

namespace {
ErrorKind kind_of(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_REM_ACCESS_ERR: return ErrorKind::kRemoteAccess;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_REM_ABORT_ERR:
    case IBV_WC_WR_FLUSH_ERR: return ErrorKind::kConnection;
    default: return ErrorKind::kTransport;
  }
}
}  // namespace

void RdmaConnection::finish_parts(const std::vector<RequestPtr>& parts) {
  std::vector<uint64_t> finished;
  for (const RequestPtr& r : parts) {
    r->part_done();
    if (r->done()) finished.push_back(r->id());
  }
  if (finished.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t id : finished) {
    active_.erase(id);
    gathers_.erase(id);
  }
}

void RdmaConnection::fail_from_completion(const ibv_wc& wc, const RequestPtr& request,
                                          const std::string& op, uint32_t piece) {
  char vendor[32];
  snprintf(vendor, sizeof(vendor), "0x%x", wc.vendor_err);
  std::string text = op + " failed: " + wc_status_text(wc.status) + ", vendor_err " + vendor +
                     " (peer " + peer() + ", QP " + std::to_string(wc.qp_num) + ")";
  if (wc.status == IBV_WC_RNR_RETRY_EXC_ERR) {
    text += ": the peer had no receive buffer posted for " + std::to_string(kRnrRetries) +
            " receiver-not-ready retries (it stopped reposting: hung or overloaded)";
  }
  ErrorKind kind = kind_of(wc.status);
  const CompletionStatus status = completion_status(wc);
  if (kind == ErrorKind::kRemoteAccess && request && request->op() == OpKind::kSend) {
    // A rendezvous SEND writes only into the buffer the receiver itself granted (its CTS), so
    // losing access means the receiver revoked it: its process died (the kernel destroys its
    // MRs before its QPs) or it closed. That is a lost peer, not a bad descriptor.
    kind = ErrorKind::kConnection;
    text += ": the receiver revoked the buffer it granted for this message (it died or closed)";
  }
  const Error why(kind == ErrorKind::kRemoteAccess ? ErrorKind::kConnection : kind,
                  "connection to " + peer() + " torn down after a failed completion: " + text, 0,
                  status);
  const Error own(kind,
                  kind == ErrorKind::kRemoteAccess
                      ? text + "; check the descriptor, remote_offset and length"
                      : text,
                  0, status);
  // The connection is marked closed before the request fails, so that whoever the failure
  // wakes already sees the endpoint closed.
  teardown(why, request, own, connection_end_level(kind), settle_gather(request, piece, own, why));
}

void RdmaConnection::on_completion(const ibv_wc& wc) {
  const int lane = static_cast<int>((wc.wr_id >> 33) & 0x7f);
  if (lane >= streams()) return;
  complete(lane, ((wc.wr_id >> 32) & 1) != 0, wc, nullptr);
}

void RdmaConnection::complete(int lane, bool is_recv, const ibv_wc& wc, const uint8_t* srq_data) {
  const int rail = lanes_[static_cast<size_t>(lane)].rail;
  bool failed_over = false;
  bool healing = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_over = !lane_up_[static_cast<size_t>(lane)];
    healing = healing_[static_cast<size_t>(lane)];
  }
  // A failed-over rail's flushes: its chunks were taken and posted elsewhere (drained() no
  // longer counts its QPs). On a lane being healed, only its probe counts.
  if (failed_over) {
    if (healing && !is_recv) on_heal_completion(lane, wc);
    return;
  }
  // A flush of the lane's QP before the rail healed (the lane has a new QP since, and the WR ids
  // name the lane), polled only after the rail rejoined: not a failure of the live QP.
  if (!is_recv && lanes_[static_cast<size_t>(lane)].sq->stale(wc)) return;
  if (is_recv && srq_data == nullptr) {
    posted_recvs_[static_cast<size_t>(lane)].fetch_sub(1);  // consumed or flushed
  }
  if (state() == State::kClosed) {
    // Flushed (or completed) after teardown began: retire it; the last one releases.
    if (!is_recv) lanes_[static_cast<size_t>(lane)].sq->retire(wc);
    release_if_drained();
    return;
  }
  if (wc.status != IBV_WC_SUCCESS) {
    // A failure on a port that is down is the link's, whatever the status (rxe gives a WR it
    // could not transmit IBV_WC_LOC_QP_OP_ERR), and it may come before the port's event.
    const std::string port_down =
        wc.status == IBV_WC_REM_ACCESS_ERR ? std::string() : port_not_active(rail);
    if (wc.status != IBV_WC_REM_ACCESS_ERR &&
        (rail != ctrl_rail() || !port_down.empty() ||
         (wc.status != IBV_WC_RNR_RETRY_EXC_ERR && other_rail_up(rail)))) {
      // A rail failed: its chunks, the failed one included, move (a bad descriptor fails the
      // transfer instead: it would on every rail; so does a peer that stopped reposting its
      // receive buffers, and a failure on the only live rail keeps its precise error unless
      // its port went down: the connection then lost every rail).
      const std::string failed = std::string(is_recv ? "a receive" : "a WR") + " failed: " +
                                 wc_status_text(wc.status) + " (QP " +
                                 std::to_string(wc.qp_num) + ")";
      rail_down(rail, port_down.empty() ? failed : port_down + ", " + failed);
      return;
    }
    if (is_recv) {
      fail_from_completion(wc, nullptr, "receive");
      return;
    }
    Retired r = lanes_[static_cast<size_t>(lane)].sq->retire(wc);
    fail_from_completion(wc, r.failed, r.failed_op, r.failed_piece);
    return;
  }
  if (is_recv) {
    try {
      on_recv(lane, wc, srq_data);
    } catch (const Error& e) {
      abort(e.kind() == ErrorKind::kProtocol ? ErrorKind::kProtocol : ErrorKind::kTransport,
            std::string("connection to ") + peer() + " aborted: " + e.what());
    }
    return;
  }
  Retired r;
  try {
    r = lanes_[static_cast<size_t>(lane)].sq->retire(wc);
  } catch (const Error& e) {
    abort(ErrorKind::kTransport, std::string("connection to ") + peer() + " aborted: " + e.what());
    return;
  }
  if (!r.parts_done.empty()) {
    stats_->add_lane(lane, r.part_bytes);
    rail_bytes_[static_cast<size_t>(rail)] += r.part_bytes;
    meter_.completed(static_cast<size_t>(rail), r.part_bytes, RailMeter::Clock::now());
    if (rail == test_err_rail_ && rail_bytes_[static_cast<size_t>(rail)] >= test_err_bytes_ &&
        !test_err_done_.exchange(true)) {
      lanes_[static_cast<size_t>(lane)].qp->to_error();  // RDMAXFER_RDMA_TEST_QP_ERR
    }
  }
  if (r.ctrl_bytes > 0) stats_->add_op("ctrl", r.ctrl_bytes);
  finish_parts(r.parts_done);
}

}  // namespace rdmaxfer
