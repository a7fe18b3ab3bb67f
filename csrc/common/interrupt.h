// Interruptible waits.
//
// A long blocking wait of the core (accept, connect, a handshake step) waits in slices of at most
// kInterruptSliceMs and calls poll_interrupt() between slices. Whoever calls into the core may
// install a check for its own thread (InterruptScope); the Python bindings install one that runs
// Python's signal handlers, so that Ctrl-C ends the wait at once. When the check reports an
// interrupt, poll_interrupt() throws Interrupted, which unwinds through RAII like any Error and
// cleans up what the wait had started (sockets, half-made connections). Without a scope (the
// core's own threads, C++ callers) poll_interrupt() does nothing.
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>

#include "common/deadline.h"

namespace rdmaxfer {

constexpr int kInterruptSliceMs = 50;

// Thrown by poll_interrupt(); the check that reported it keeps the details (the bindings leave
// Python's KeyboardInterrupt set).
class Interrupted : public std::exception {
 public:
  const char* what() const noexcept override { return "interrupted"; }
};

// Returns true when the current wait must end (e.g. a signal handler raised).
using InterruptCheck = bool (*)();

// Installs `check` for the current thread until destroyed (scopes nest).
class InterruptScope {
 public:
  explicit InterruptScope(InterruptCheck check);
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  InterruptCheck previous_;
};

// Runs the current thread's check, if any; throws Interrupted when it reports an interrupt.
void poll_interrupt();

// Sleeps `seconds` (bounded by `deadline`), in slices, polling for interrupts.
void sleep_interruptible(double seconds, const Deadline& deadline);

// cv.wait_until(deadline, pred) in slices; between slices the lock is released while the
// interrupt check runs (it may take other locks, e.g. Python's GIL). True when pred() holds.
template <class Pred>
bool wait_interruptible(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                        const Deadline& deadline, Pred pred) {
  for (;;) {
    const auto slice = std::chrono::milliseconds(deadline.remaining_ms(kInterruptSliceMs));
    if (cv.wait_for(lock, slice, pred)) return true;
    if (deadline.expired()) return false;
    lock.unlock();
    try {
      poll_interrupt();
    } catch (...) {
      lock.lock();
      throw;
    }
    lock.lock();
  }
}

}  // namespace rdmaxfer
