#include "core/request.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

#include "common/deadline.h"
#include "core/notifier.h"
#include "core/poll_mode.h"

namespace rdmaxfer {

const char* op_kind_name(OpKind op) {
  switch (op) {
    case OpKind::kWrite: return "WRITE";
    case OpKind::kRead: return "READ";
    case OpKind::kSend: return "SEND";
    case OpKind::kRecv: return "RECV";
    case OpKind::kRecvHeader: return "RECV (message header)";
  }
  return "unknown op";
}

Request::Request(uint64_t id, OpKind op, uint64_t bytes)
    : id_(id), op_(op), bytes_(bytes), last_progress_ns_(steady_ns()) {}

Request::State Request::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

void Request::set_parts(uint64_t parts) {
  parts_total_.store(parts);
  parts_left_.store(parts);
}

void Request::part_done() {
  last_progress_ns_.store(steady_ns(), std::memory_order_relaxed);
  forward(0);
  if (parts_left_.fetch_sub(1) == 1) complete();
}

bool Request::add_part() {
  uint64_t left = parts_left_.load();
  while (left > 0) {
    if (parts_left_.compare_exchange_weak(left, left + 1)) {
      parts_total_.fetch_add(1);
      return true;
    }
  }
  return false;
}

void Request::note_progress(uint64_t bytes) {
  moved_.fetch_add(bytes, std::memory_order_relaxed);
  last_progress_ns_.store(steady_ns(), std::memory_order_relaxed);
  forward(bytes);
}

void Request::forward(uint64_t bytes) {
  if (!forwards_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(forward_mu_);
  if (!parent_) return;
  parent_->note_progress(bytes);
  forwarded_ += bytes;
}

void Request::forward_progress(std::shared_ptr<Request> parent) {
  std::lock_guard<std::mutex> lock(forward_mu_);
  parent_ = std::move(parent);
  forwards_.store(parent_ != nullptr, std::memory_order_release);
}

uint64_t Request::forwarded_bytes() const {
  std::lock_guard<std::mutex> lock(forward_mu_);
  return forwarded_;
}

double Request::idle_s() const {
  return static_cast<double>(steady_ns() - last_progress_ns_.load(std::memory_order_relaxed)) *
         1e-9;
}

uint64_t Request::moved_bytes() const {
  if (state() == State::kDone) return bytes_;
  const uint64_t total = parts_total_.load();
  const uint64_t left = std::min(parts_left_.load(), total);
  const uint64_t by_parts =
      total == 0 ? 0
                 : static_cast<uint64_t>(static_cast<double>(bytes_) *
                                         static_cast<double>(total - left) /
                                         static_cast<double>(total));
  return std::max(by_parts, std::min(moved_.load(std::memory_order_relaxed), bytes_));
}

void Request::complete() {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ == State::kPending) finish_locked(State::kDone, lock);
}

void Request::complete_with_message(MessageInfo info) {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ != State::kPending) return;
  message_ = std::move(info);
  finish_locked(State::kDone, lock);
}

void Request::fail(ErrorKind kind, const std::string& message) { fail(Error(kind, message)); }

void Request::fail(const Error& cause) {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ != State::kPending) return;
  error_kind_ = cause.kind();
  error_ = std::string(op_kind_name(op_)) + " failed: " + cause.what();
  error_errno_ = cause.err_no();
  error_completion_ = cause.completion();
  finish_locked(State::kFailed, lock);
}

void Request::then(std::function<void(const Request&)> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kPending) {
      if (!on_terminal_) {
        on_terminal_ = std::move(fn);
      } else {
        on_terminal_ = [first = std::move(on_terminal_), next = std::move(fn)](const Request& r) {
          first(r);
          next(r);
        };
      }
      return;
    }
  }
  fn(*this);
}

void Request::finish_locked(State state, std::unique_lock<std::mutex>& lock) {
  state_ = state;
  terminal_.store(true, std::memory_order_release);
  std::shared_ptr<Notifier> notifier = notifier_;
  std::function<void(const Request&)> on_terminal = std::move(on_terminal_);
  lock.unlock();
  if (on_terminal) on_terminal(*this);
  cv_.notify_all();
  if (notifier) notifier->push(id_);
}

namespace {
// Polls of a Progress between two looks at the clock: in a VM the clock may be an emulated
// device (HPET) whose every read costs microseconds. The spin bound starts at the first look.
constexpr unsigned kPollsPerClockRead = 32;
}  // namespace

bool Request::wait_for(double timeout_s, int spin_us) const {
  if (terminal_.load(std::memory_order_acquire)) return true;
  const std::shared_ptr<Progress> progress = progress_.lock();
  if (!progress) return wait_with(nullptr, timeout_s, spin_us);
  const int64_t start_ns = steady_ns();
  const bool done = wait_with(progress.get(), timeout_s, spin_us);
  progress->waited(steady_ns() - start_ns);
  return done;
}

bool Request::wait_with(Progress* progress, double timeout_s, int spin_us) const {
  if (progress != nullptr) {
    const double left = progress->drive(terminal_, timeout_s);
    if (terminal_.load(std::memory_order_acquire)) return true;
    if (left < timeout_s) {  // it drove for a while: no spin after that
      timeout_s = std::max(0.0, left);
      spin_us = 0;
    }
  }
  if (spin_us > 0 && !terminal_.load(std::memory_order_acquire)) {
    std::chrono::steady_clock::time_point until{};
    bool started = false;
    unsigned turns = 0;
    while (!terminal_.load(std::memory_order_acquire)) {
      if (progress) {
        if (!progress->progress()) cpu_pause();
        if (++turns % kPollsPerClockRead != 0) continue;
      } else {
        sched_yield();
      }
      const auto now = std::chrono::steady_clock::now();
      if (!started) {
        until = now + std::chrono::microseconds(spin_us);
        started = true;
      } else if (now >= until) {
        break;
      }
    }
    if (terminal_.load(std::memory_order_acquire)) return true;
  }
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                      [this] { return state_ != State::kPending; });
}

void Request::rethrow() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kFailed) throw Error(error_kind_, error_, error_errno_, error_completion_);
}

MessageInfo Request::message() const {
  std::lock_guard<std::mutex> lock(mu_);
  return message_;
}

ErrorKind Request::error_kind() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_kind_;
}

std::string Request::error_message() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void Request::watch(const std::shared_ptr<Notifier>& notifier) {
  std::unique_lock<std::mutex> lock(mu_);
  notifier_ = notifier;
  const bool terminal = state_ != State::kPending;
  lock.unlock();
  if (terminal) notifier->push(id_);
}

}  // namespace rdmaxfer
