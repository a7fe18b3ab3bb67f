#include "core/poll_mode.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "common/cpus.h"
#include "common/deadline.h"
#include "common/error.h"

namespace rdmaxfer {

namespace {
// Spin turns between two sched_yield calls.
constexpr unsigned kTurnsPerYield = 8;
}  // namespace

PollMode parse_poll_mode(const std::string& configured) {
  std::string mode = configured;
  std::string origin = "poll_mode";
  if (mode.empty()) {
    const char* env = std::getenv("RDMAXFER_POLL_MODE");
    if (env == nullptr || *env == '\0') return PollMode::kAdaptive;
    mode = env;
    origin = "RDMAXFER_POLL_MODE";
  }
  if (mode == "event") return PollMode::kEvent;
  if (mode == "adaptive") return PollMode::kAdaptive;
  if (mode == "busy") return PollMode::kBusy;
  throw Error(ErrorKind::kInvalidArgument,
              origin + "='" + mode +
                  "' must be 'adaptive' (the default: spin a short self-tuned time, then "
                  "sleep), 'busy' (spin while waiting: lowest latency, a CPU per waiting "
                  "thread) or 'event' (sleep at once: least CPU)");
}

const char* poll_mode_name(PollMode mode) {
  switch (mode) {
    case PollMode::kEvent: return "event";
    case PollMode::kAdaptive: return "adaptive";
    case PollMode::kBusy: return "busy";
  }
  return "unknown";
}

SpinBudget::SpinBudget(PollMode mode, Kind kind, std::shared_ptr<Stats> stats)
    : mode_(mode),
      share_capped_(mode == PollMode::kAdaptive && kind == Kind::kLinger && usable_cpus() > 1),
      busy_ns_(kind == Kind::kLinger ? kBusyLingerNs : kForever),
      stats_(std::move(stats)) {}

int64_t SpinBudget::spin_ns() const {
  switch (mode_) {
    case PollMode::kEvent: return 0;
    case PollMode::kBusy: return busy_ns_;
    case PollMode::kAdaptive: break;
  }
  if (share_capped_) {
    const int64_t elapsed = steady_ns() - window_start_ns_.load(std::memory_order_relaxed);
    if (elapsed < kShareWindowNs &&
        window_spun_ns_.load(std::memory_order_relaxed) * 100 > kLingerSharePct * elapsed) {
      return 0;
    }
  }
  return budget_ns_.load(std::memory_order_relaxed);
}

void SpinBudget::spun(int64_t ns) {
  if (stats_) stats_->add_linger_ns(static_cast<uint64_t>(ns));
  if (!share_capped_) return;
  const int64_t now = steady_ns();
  if (now - window_start_ns_.load(std::memory_order_relaxed) >= kShareWindowNs) {
    window_start_ns_.store(now - ns, std::memory_order_relaxed);
    window_spun_ns_.store(ns, std::memory_order_relaxed);
  } else {
    window_spun_ns_.fetch_add(ns, std::memory_order_relaxed);
  }
}

void SpinBudget::record(int64_t waited_ns) {
  if (mode_ != PollMode::kAdaptive) return;
  const int64_t budget = budget_ns_.load(std::memory_order_relaxed);
  int64_t next = budget / 2;
  if (waited_ns <= kMaxNs) next = (3 * budget + std::min(kMaxNs, 2 * waited_ns)) / 4;
  // Racing threads may each store their own update: any of them is a fair estimate.
  budget_ns_.store(next, std::memory_order_relaxed);
}

void spin_pause(unsigned turn) {
  if (turn % kTurnsPerYield == kTurnsPerYield - 1) {
    sched_yield();
  } else {
    cpu_pause();
  }
}

}  // namespace rdmaxfer
