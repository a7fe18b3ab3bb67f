#include "transport/tcp/io_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "common/deadline.h"
#include "common/error.h"

namespace rdmaxfer {

IoLoop::IoLoop(PollMode mode, std::shared_ptr<Stats> stats)
    : linger_(mode, SpinBudget::Kind::kLinger, std::move(stats)),
      wait_budget_(mode, SpinBudget::Kind::kWait),
      epoll_fd_(epoll_create1(EPOLL_CLOEXEC)), wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!epoll_fd_.valid()) throw_errno("epoll_create1");
  if (!wake_fd_.valid()) throw_errno("eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_.get();
  if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev) != 0) {
    throw_errno("epoll_ctl(ADD eventfd)");
  }
  thread_ = std::thread([this] { run(); });
}

IoLoop::~IoLoop() { stop(); }

void IoLoop::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  uint64_t one = 1;
  ssize_t n = write(wake_fd_.get(), &one, sizeof(one));
  (void)n;
  thread_.join();
}

void IoLoop::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    tasks_.push_back(std::move(task));
  }
  uint64_t one = 1;
  ssize_t n = write(wake_fd_.get(), &one, sizeof(one));
  (void)n;
}

void IoLoop::add(const std::shared_ptr<IoHandler>& handler) {
  // Into epoll at once, so that want_write() from the caller's thread finds the fd; into the
  // handler map on the loop thread. An event that comes first is reported again (level-
  // triggered) after the task below has run.
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = handler->fd();
  if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, handler->fd(), &ev) != 0) {
    throw_errno("epoll_ctl(ADD socket)");
  }
  post([this, handler] { handlers_[handler->fd()] = handler; });
}

void IoLoop::remove(int fd) {
  auto it = handlers_.find(fd);
  if (it == handlers_.end()) return;
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
  handlers_.erase(it);
}

void IoLoop::watch(int fd, bool read, bool write) {
  epoll_event ev{};
  ev.events = (read ? EPOLLIN : 0u) | (write ? EPOLLOUT : 0u);
  ev.data.fd = fd;
  // ENOENT: the handler was removed meanwhile; nothing to arm.
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, fd, &ev);
}

int IoLoop::wait_events(epoll_event* events, int max, bool after_events, int64_t since_ns) {
  const int64_t linger = after_events ? linger_.spin_ns() : 0;
  int n = 0;
  if (linger > 0) {
    for (unsigned turn = 0; !stop_.load(std::memory_order_relaxed); ++turn) {
      n = epoll_wait(epoll_fd_.get(), events, max, 0);
      if (n != 0 || steady_ns() - since_ns >= linger) break;
      spin_pause(turn);
    }
    linger_.spun(steady_ns() - since_ns);
  }
  if (n == 0) n = epoll_wait(epoll_fd_.get(), events, max, 1000);
  if (after_events && n >= 0) linger_.record(steady_ns() - since_ns);
  return n;
}

void IoLoop::run() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  bool had_events = false;
  int64_t since_ns = 0;  // when the last batch of events was handled
  while (!stop_.load()) {
    int n = wait_events(events, kMaxEvents, had_events, since_ns);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;  // the epoll fd itself is broken; handlers fail when their owners time out
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_.get()) {
        uint64_t count = 0;
        ssize_t r = read(wake_fd_.get(), &count, sizeof(count));
        (void)r;
        continue;
      }
      auto it = handlers_.find(fd);
      if (it == handlers_.end()) continue;
      std::shared_ptr<IoHandler> handler = it->second;  // may remove itself below
      const uint32_t e = events[i].events;
      if (e & EPOLLIN) handler->on_readable();
      if (e & EPOLLOUT) handler->on_writable();
      if ((e & (EPOLLERR | EPOLLHUP)) && !(e & EPOLLIN)) handler->on_error();
    }
    std::vector<std::function<void()>> tasks;
    {
      std::lock_guard<std::mutex> lock(tasks_mu_);
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task();
    had_events = n > 0;
    since_ns = steady_ns();
  }
  handlers_.clear();
}

}  // namespace rdmaxfer
