#include "transport/rdma/cq_poller.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include <cerrno>

#include "common/error.h"
#include "common/fork_guard.h"

namespace rdmaxfer {

namespace {
constexpr uint64_t kChannelKey = 1ull << 62;
constexpr uint64_t kAsyncKey = 2ull << 62;
constexpr uint64_t kWakeKey = 3ull << 62;
constexpr uint64_t kKindMask = 3ull << 62;
constexpr int kBatch = 32;
constexpr int kBusyPollsPerCheck = 256;

void epoll_add(int ep, int fd, uint32_t events, uint64_t key) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = key;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) throw_errno("epoll_ctl(ADD)");
}
}  // namespace

CqPoller::CqPoller(std::shared_ptr<DeviceContext> context,
                   std::shared_ptr<CompletionChannel> channel, bool busy, Handlers handlers)
    : context_(std::move(context)),
      channel_(std::move(channel)),
      busy_(busy),
      handlers_(std::move(handlers)),
      epoll_(epoll_create1(EPOLL_CLOEXEC)),
      wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      fork_generation_(fork_generation()) {
  if (!epoll_.valid()) throw_errno("epoll_create1");
  if (!wake_.valid()) throw_errno("eventfd");
  const int async_fd = context_->get()->async_fd;
  const int flags = fcntl(async_fd, F_GETFL);
  if (flags < 0 || fcntl(async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw_errno("fcntl(O_NONBLOCK) on the async event fd");
  }
  epoll_add(epoll_.get(), channel_->fd(), EPOLLIN, kChannelKey);
  epoll_add(epoll_.get(), async_fd, EPOLLIN, kAsyncKey);
  epoll_add(epoll_.get(), wake_.get(), EPOLLIN, kWakeKey);
}

CqPoller::~CqPoller() { stop(); }

void CqPoller::start() { thread_ = std::thread([this] { run(); }); }

void CqPoller::add_cq(std::shared_ptr<CompletionQueue> cq) {
  std::lock_guard<std::mutex> lock(cqs_mu_);
  const int n = n_cqs_.load(std::memory_order_relaxed);
  if (n == kMaxCqs) {
    throw Error(ErrorKind::kConnection,
                "too many open rdma connections: all " + std::to_string(kMaxCqs) +
                    " completion queues of this engine are full; close endpoints you no longer "
                    "use");
  }
  if (!busy_) cq->arm();
  cqs_[static_cast<size_t>(n)] = cq.get();
  owned_.push_back(std::move(cq));
  n_cqs_.store(n + 1, std::memory_order_release);
}

void CqPoller::stop() {
  stop_.store(true);
  const uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof(one)) < 0) {
    // The eventfd cannot overflow here; the thread also polls stop_ every 100 ms.
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(poll_mu_);  // waits out a caller's dispatch in progress
  stopped_ = true;
}

void CqPoller::watch_socket(int fd, uint64_t tag) {
  epoll_add(epoll_.get(), fd, EPOLLIN | EPOLLRDHUP, tag & ~kKindMask);
}

void CqPoller::unwatch_socket(int fd) noexcept {
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

namespace {
// Set while this thread dispatches completions (poll_mu_ held): a handler that waits on a request
// must not try to lock poll_mu_ again (try_lock on a mutex the caller owns is undefined).
thread_local bool t_dispatching = false;

class DispatchScope {
 public:
  DispatchScope() { t_dispatching = true; }
  ~DispatchScope() { t_dispatching = false; }
  DispatchScope(const DispatchScope&) = delete;
  DispatchScope& operator=(const DispatchScope&) = delete;
};
}  // namespace

bool CqPoller::dispatching() { return t_dispatching; }

bool CqPoller::poll_once_locked(int* found) {
  ibv_wc wcs[kBatch];
  bool more = false;
  const int count = n_cqs_.load(std::memory_order_acquire);
  for (int i = 0; i < count; ++i) {
    const int n = cqs_[static_cast<size_t>(i)]->poll(kBatch, wcs);
    if (n > 0) handlers_.completions(wcs, n);
    *found += n;
    more = more || n == kBatch;
  }
  return more;
}

void CqPoller::drain_cq() {
  std::lock_guard<std::mutex> lock(poll_mu_);
  if (stopped_ || failed_) return;
  DispatchScope scope;
  try {
    int found = 0;
    while (poll_once_locked(&found)) {
    }
  } catch (...) {
    failed_ = true;  // run() reports it through the fatal handler and ends the thread
    throw;
  }
}

bool CqPoller::progress() {
  if (t_dispatching || fork_generation_ != fork_generation()) return false;
  std::unique_lock<std::mutex> lock(poll_mu_, std::try_to_lock);
  if (!lock.owns_lock() || stopped_ || failed_) return false;
  DispatchScope scope;
  try {
    int found = 0;
    poll_once_locked(&found);
    return found > 0;
  } catch (const std::exception& e) {
    failed_ = true;
    if (handlers_.fatal) handlers_.fatal(std::string("polling the completion queue: ") + e.what());
    return true;
  }
}

void CqPoller::drain_async() {
  for (;;) {
    ibv_async_event event{};
    if (verbs().get_async_event(context_->get(), &event) != 0) return;  // EAGAIN: none left
    handlers_.async_event(event);
    verbs().ack_async_event(&event);
  }
}

void CqPoller::run() {
  try {
    epoll_event events[16];
    int idle_polls = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
      int timeout_ms = 100;
      if (busy_) {
        drain_cq();
        if (++idle_polls < kBusyPollsPerCheck) continue;
        idle_polls = 0;
        timeout_ms = 0;
      }
      const int n = epoll_wait(epoll_.get(), events, 16, timeout_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_errno("epoll_wait");
      }
      for (int i = 0; i < n; ++i) {
        const uint64_t key = events[i].data.u64;
        switch (key & kKindMask) {
          case kChannelKey:
            while (CompletionQueue* cq = channel_->take_event()) {
              if (!busy_) cq->arm();
            }
            drain_cq();
            break;
          case kAsyncKey: drain_async(); break;
          case kWakeKey: {
            uint64_t v;
            if (read(wake_.get(), &v, sizeof(v)) < 0) {
              // EAGAIN: already drained
            }
            break;
          }
          default: handlers_.socket_ready(key); break;
        }
      }
    }
  } catch (const std::exception& e) {
    if (handlers_.fatal) handlers_.fatal(std::string("completion thread stopped: ") + e.what());
  }
}

}  // namespace rdmaxfer
