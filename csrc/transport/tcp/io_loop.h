// One I/O thread: an epoll loop over the sockets it was given, plus a task queue woken by an
// eventfd. It never touches Python. Handlers run on the loop thread only.
//
// Its poll mode (core/poll_mode.h) decides how it waits: after a batch of events it polls
// epoll without blocking for its linger budget (adaptive: self-tuned from the gaps between
// events; busy: SpinBudget::kBusyLingerNs; event: none) before it sleeps in epoll_wait, so the
// next frame of a back-to-back exchange finds it awake. It also keeps the budget of the waits
// of callers that drive its streams (TcpStream::drive).
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/unique_fd.h"
#include "core/poll_mode.h"

namespace rdmaxfer {

class IoHandler {
 public:
  virtual ~IoHandler() = default;
  virtual int fd() const = 0;
  virtual void on_readable() = 0;
  virtual void on_writable() = 0;
  // EPOLLERR/EPOLLHUP without readable data.
  virtual void on_error() = 0;
};

class IoLoop {
 public:
  // `stats`: the engine's, which counts the loop's linger (Stats::add_linger_ns).
  IoLoop(PollMode mode, std::shared_ptr<Stats> stats);
  IoLoop(const IoLoop&) = delete;
  IoLoop& operator=(const IoLoop&) = delete;
  ~IoLoop();

  // Runs `task` on the loop thread (soon).
  void post(std::function<void()> task);
  // Adds a handler (from any thread); the loop keeps it alive until remove(). Throws when the
  // fd cannot be watched.
  void add(const std::shared_ptr<IoHandler>& handler);
  // Removes the handler from the loop (call on the loop thread, e.g. inside a handler/task).
  void remove(int fd);
  // Sets which readiness of fd the loop reports (any thread): readable, writable, both or
  // neither (errors and hang-ups are reported regardless).
  void watch(int fd, bool read, bool write);
  bool in_loop_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // The spin budget of a caller's wait for a completion on one of this loop's streams.
  SpinBudget& wait_budget() { return wait_budget_; }
  void stop();

 private:
  void run();
  // epoll_wait, first without blocking for the linger budget when the last call had events.
  int wait_events(epoll_event* events, int max, bool after_events, int64_t since_ns);

  SpinBudget linger_;
  SpinBudget wait_budget_;
  UniqueFd epoll_fd_;
  UniqueFd wake_fd_;
  std::atomic<bool> stop_{false};
  std::mutex tasks_mu_;
  std::vector<std::function<void()>> tasks_;
  std::unordered_map<int, std::shared_ptr<IoHandler>> handlers_;  // loop thread only
  std::thread thread_;
};

}  // namespace rdmaxfer
