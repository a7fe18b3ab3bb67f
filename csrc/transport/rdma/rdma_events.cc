// RdmaTransport: what the rails' pollers (cq_poller.h) hand up, dispatched to the connections:
// work completions (by the tag in their wr_id, or by qp_num for a receive from the rail's SRQ),
// asynchronous events (a QP, SRQ, CQ, port or device failing: the rail fails over) and
// readiness of a connection's bootstrap socket.
#include <memory>
#include <mutex>
#include <string>

#include "common/error.h"
#include "transport/rdma/rdma_transport.h"

namespace rdmaxfer {

std::shared_ptr<RdmaConnection> RdmaTransport::find(uint32_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = connections_.find(tag);
  return it == connections_.end() ? nullptr : it->second.lock();
}

std::shared_ptr<RdmaConnection> RdmaTransport::find_qp(int rail, uint32_t qp_num) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto& tags = qp_tags_[static_cast<size_t>(rail)];
  auto t = tags.find(qp_num);
  if (t == tags.end()) return nullptr;
  auto it = connections_.find(t->second);
  return it == connections_.end() ? nullptr : it->second.lock();
}

void RdmaTransport::on_srq_receive(int rail, const ibv_wc& wc) {
  SharedReceiveQueue* srq = rails_[static_cast<size_t>(rail)].srq.get();
  if (srq == nullptr) return;  // not this rail's: no SRQ WR was ever posted here
  try {
    srq->taken();
    const uint8_t* data = srq->buffer(wc.wr_id);
    // None: a flush after its connection was freed. The buffer goes back either way.
    if (auto conn = find_qp(rail, wc.qp_num)) conn->on_srq_completion(rail, wc, data);
    srq->repost(wc.wr_id);
  } catch (const Error& e) {
    rail_failed(rail, "the shared receive queue of " +
                          rails_[static_cast<size_t>(rail)].name + " failed: " +
                          e.what());
  }
}

void RdmaTransport::on_completions(int rail, const ibv_wc* wcs, int n) {
  std::shared_ptr<RdmaConnection> conn;
  for (int i = 0; i < n; ++i) {
    if (SharedReceiveQueue::owns(wcs[i].wr_id)) {
      on_srq_receive(rail, wcs[i]);
      continue;
    }
    const uint32_t tag = wr_tag(wcs[i].wr_id);
    if (!conn || conn->tag() != tag) conn = find(tag);
    if (conn) conn->on_completion(wcs[i]);  // none: a flush after the connection was freed
  }
}

void RdmaTransport::on_async_event(int rail, const ibv_async_event& event) {
  const std::string what =
      std::string("asynchronous event: ") + verbs().event_type_str(event.event_type);
  switch (event.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR: {
      const auto tag = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(event.element.qp->qp_context));
      if (auto conn = find(tag)) conn->on_qp_event(event.element.qp->qp_num, what);
      return;
    }
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      if (const auto& srq = rails_[static_cast<size_t>(rail)].srq) {
        try {
          srq->on_limit();
        } catch (const Error& e) {
          rail_failed(rail, "growing the shared receive queue of " +
                                rails_[static_cast<size_t>(rail)].name +
                                " failed: " + e.what());
        }
      }
      return;
    case IBV_EVENT_DEVICE_FATAL:
      // The device is gone for good: failover now, then the rail watch releases it.
      rail_failed(rail, "device " + rails_[static_cast<size_t>(rail)].name + ": " + what);
      device_fatal(rail, "device " + rails_[static_cast<size_t>(rail)].name + ": " + what);
      return;
    case IBV_EVENT_PORT_ERR: {
      std::shared_ptr<DeviceContext> context;
      {
        std::lock_guard<std::mutex> lock(mu_);
        context = rails_[static_cast<size_t>(rail)].context;
      }
      // Read after the port came back (a link that flaps queues its events): the rail may have
      // rejoined meanwhile, and a QP the outage broke fails its WRs on its own.
      if (context && context->port_not_active().empty()) return;
      rail_failed(rail, "device " + rails_[static_cast<size_t>(rail)].name + ": " + what);
      return;
    }
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_CQ_ERR:
      rail_failed(rail, "device " + rails_[static_cast<size_t>(rail)].name + ": " + what);
      return;
    default: return;  // informational (LID change, last WQE reached, ...)
  }
}

void RdmaTransport::rail_failed(int rail, const std::string& cause) {
  const std::vector<std::shared_ptr<RdmaConnection>> conns = live_connections();
  // One rail: its connections close (rail_down of their only rail says so).
  for (const auto& c : conns) c->rail_down(rail, cause);
}

void RdmaTransport::on_socket(uint64_t tag) {
  if (auto conn = find(static_cast<uint32_t>(tag))) conn->on_socket_ready();
}

}  // namespace rdmaxfer
