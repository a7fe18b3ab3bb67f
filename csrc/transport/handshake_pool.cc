#include "transport/handshake_pool.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <cerrno>
#include <system_error>

#include "common/error.h"

namespace rdmaxfer {

HandshakePool::HandshakePool(int max_in_flight) : max_in_flight_(max_in_flight) {}

HandshakePool::~HandshakePool() { stop(); }

void HandshakePool::reap_locked() {
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->done) {
      auto next = std::next(it);
      finished_.splice(finished_.end(), workers_, it);
      it = next;
    } else {
      ++it;
    }
  }
}

void HandshakePool::start(UniqueFd fd, std::function<void(UniqueFd)> work) {
  std::list<Worker> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reap_locked();
    finished.swap(finished_);
    if (stopped_) return;  // fd closes here
    UniqueFd cancel(fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!cancel.valid()) throw_errno(ErrorKind::kTransport, "handshake: dup of the socket", errno);
    workers_.emplace_back();
    Worker& w = workers_.back();
    w.cancel = std::move(cancel);
    w.started = std::chrono::steady_clock::now();
    try {
      w.thread = std::thread([this, &w, fd = std::move(fd), work = std::move(work)]() mutable {
        try {
          work(std::move(fd));
        } catch (...) {
          // `work` reports its own failures; whatever escapes ends this client only.
        }
        std::lock_guard<std::mutex> done_lock(mu_);
        w.done = true;
        w.cancel.reset();
      });
    } catch (const std::system_error& e) {
      workers_.pop_back();
      throw Error(ErrorKind::kTransport,
                  std::string("handshake: starting a thread: ") + e.what());
    }
  }
  for (auto& w : finished) w.thread.join();
}

bool HandshakePool::full() { return in_flight() >= max_in_flight_; }

int HandshakePool::in_flight() {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& w : workers_) n += w.done ? 0 : 1;
  return n;
}

int HandshakePool::cut_older_than(double seconds) {
  const auto before = std::chrono::steady_clock::now() -
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(seconds));
  std::lock_guard<std::mutex> lock(mu_);
  int cut = 0;
  for (auto& w : workers_) {
    if (w.done || !w.cancel.valid() || w.started > before) continue;
    ::shutdown(w.cancel.get(), SHUT_RDWR);
    w.cancel.reset();  // cut once; the worker's own fd fails from now on
    ++cut;
  }
  return cut;
}

void HandshakePool::stop() {
  std::list<Worker> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    for (auto& w : workers_) {
      if (w.cancel.valid()) ::shutdown(w.cancel.get(), SHUT_RDWR);
    }
    all.swap(workers_);
    all.splice(all.end(), finished_);
  }
  for (auto& w : all) {
    if (w.thread.joinable()) w.thread.join();
  }
}

}  // namespace rdmaxfer
