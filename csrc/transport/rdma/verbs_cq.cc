#include "transport/rdma/verbs_cq.h"

#include <fcntl.h>

#include <cerrno>

#include "common/error.h"

namespace rdmaxfer {

CompletionChannel::CompletionChannel(std::shared_ptr<DeviceContext> context)
    : context_(std::move(context)) {
  channel_ = verbs().create_comp_channel(context_->get());
  if (channel_ == nullptr) throw_verbs("ibv_create_comp_channel", errno);
  const int flags = fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    const int e = errno;
    verbs().destroy_comp_channel(channel_);
    throw_errno(ErrorKind::kTransport, "fcntl(O_NONBLOCK) on the completion channel", e);
  }
}

CompletionChannel::~CompletionChannel() {
  if (channel_ != nullptr) verbs().destroy_comp_channel(channel_);
}

CompletionQueue::CompletionQueue(std::shared_ptr<DeviceContext> context,
                                 std::shared_ptr<CompletionChannel> channel, int cqe)
    : context_(std::move(context)), channel_(std::move(channel)) {
  cq_ = verbs().create_cq(context_->get(), cqe, this, channel_ ? channel_->get() : nullptr, 0);
  if (cq_ == nullptr) throw_verbs("ibv_create_cq(" + std::to_string(cqe) + " entries)", errno);
}

CompletionQueue::~CompletionQueue() {
  if (cq_ != nullptr) verbs().destroy_cq(cq_);
}

void CompletionQueue::arm() {
  const int rc = ibv_req_notify_cq(cq_, 0);
  if (rc != 0) throw_verbs("ibv_req_notify_cq", rc);
}

CompletionQueue* CompletionChannel::take_event() {
  ibv_cq* cq = nullptr;
  void* cq_context = nullptr;
  if (verbs().get_cq_event(channel_, &cq, &cq_context) != 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return nullptr;
    throw_verbs("ibv_get_cq_event", errno);
  }
  verbs().ack_cq_events(cq, 1);
  return static_cast<CompletionQueue*>(cq_context);
}

int CompletionQueue::poll(int max, ibv_wc* out) {
  const int n = ibv_poll_cq(cq_, max, out);
  if (n < 0) throw_verbs("ibv_poll_cq", -n > 0 ? -n : EIO);
  return n;
}

}  // namespace rdmaxfer
