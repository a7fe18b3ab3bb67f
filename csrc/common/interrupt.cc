#include "common/interrupt.h"

#include <algorithm>
#include <thread>

namespace rdmaxfer {

namespace {
thread_local InterruptCheck current_check = nullptr;
}  // namespace

InterruptScope::InterruptScope(InterruptCheck check) : previous_(current_check) {
  current_check = check;
}

InterruptScope::~InterruptScope() { current_check = previous_; }

void poll_interrupt() {
  if (current_check != nullptr && current_check()) throw Interrupted();
}

void sleep_interruptible(double seconds, const Deadline& deadline) {
  const Deadline until(seconds);
  for (;;) {
    const int ms = std::min(until.remaining_ms(kInterruptSliceMs),
                            deadline.remaining_ms(kInterruptSliceMs));
    if (ms <= 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    poll_interrupt();
  }
}

}  // namespace rdmaxfer
