// How a thread that waits for I/O spends the wait: the poll_mode of an engine.
//
//   event     sleep at once (in poll/epoll_wait or on a condition variable): least CPU, a
//             wake-up per completion.
//   adaptive  spin (poll without blocking) for a bounded, self-tuned time first, then sleep:
//             back-to-back small operations complete without a wake-up, an idle engine sleeps.
//   busy      spin for the whole wait (a waiting caller, until its operation ends or its wait
//             slice does) and keep spinning kBusyLingerNs after each event (an I/O thread).
//
// A SpinBudget is the self-tuned bound of one kind of wait (a caller's wait for a completion, an
// I/O thread's wait for the next event): after each wait, record() moves it towards twice the
// waits that ended within kMaxNs, and halves it after one that took longer
// (spinning for that would not have paid). Every spin yields the CPU every few turns
// (spin_pause), so on one CPU, or a crowded one, the peer that must answer runs meanwhile.
// An adaptive I/O thread's lingering is also capped in CPU where the process may run on more
// than one CPU: it spins at most kLingerSharePct of its time (per window of kShareWindowNs) and
// sleeps at once beyond that, so a closed loop of small operations costs the peer's I/O thread
// its work plus that share, not a whole CPU. On one CPU there is no cap: a spin that yields
// every few turns takes only time that no other thread wants.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "core/stats.h"

namespace rdmaxfer {

enum class PollMode { kEvent, kAdaptive, kBusy };

// "event", "adaptive" or "busy"; "" -> env RDMAXFER_POLL_MODE -> "adaptive". Throws
// Error(kInvalidArgument) naming the bad value (and where it came from) and the three choices.
PollMode parse_poll_mode(const std::string& configured);
const char* poll_mode_name(PollMode mode);

class SpinBudget {
 public:
  // The longest self-tuned spin (of a caller's wait for a completion, of an I/O thread's linger
  // for the next event), and where it starts.
  static constexpr int64_t kMaxNs = 1'000'000;
  static constexpr int64_t kStartNs = 50'000;
  // How long an I/O thread in busy mode keeps spinning after its last event.
  static constexpr int64_t kBusyLingerNs = 20'000'000;
  static constexpr int64_t kForever = std::numeric_limits<int64_t>::max();
  // The most of an adaptive I/O thread's time that lingering may spin, in % of wall time over
  // windows of kShareWindowNs.
  static constexpr int64_t kLingerSharePct = 20;
  static constexpr int64_t kShareWindowNs = 10'000'000;
  enum class Kind { kWait, kLinger };

  // kWait: a caller's wait for a completion (busy: spins until the wait's end); kLinger: an I/O
  // thread between events (busy: kBusyLingerNs). Adaptive tunes either up to kMaxNs.
  // `stats`: where spun() counts the time spent spinning (Stats::add_linger_ns), or none.
  SpinBudget(PollMode mode, Kind kind, std::shared_ptr<Stats> stats = nullptr);

  // Nanoseconds to spin before sleeping: 0 (event), the tuned bound (adaptive) or busy's; for
  // adaptive lingering on more than one CPU, 0 while the current window has spun its share.
  int64_t spin_ns() const;
  // A wait that started `waited_ns` ago ended (its event came, spinning or after a sleep).
  void record(int64_t waited_ns);
  // `ns` of the last wait went on spinning: counted against kLingerSharePct, and in `stats`.
  void spun(int64_t ns);

 private:
  const PollMode mode_;
  const bool share_capped_;  // adaptive lingering, on more than one CPU
  const int64_t busy_ns_;
  const std::shared_ptr<Stats> stats_;
  std::atomic<int64_t> budget_ns_{kStartNs};
  std::atomic<int64_t> window_start_ns_{0};  // steady clock
  std::atomic<int64_t> window_spun_ns_{0};
};

// A spin-wait hint to the CPU (x86 pause, arm yield).
inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// One turn of a spin loop: a pause, and every few turns a sched_yield, so a thread that must run
// for the spin to end (the peer, on a busy machine) gets the CPU.
void spin_pause(unsigned turn);

}  // namespace rdmaxfer
