// One log sink for the C++ core; the bindings bridge it to Python's `logging` (logger
// "rdmaxfer", silent by default). Nothing in csrc/ prints to stderr: every message goes here.
//
// Threads: I/O and completion threads call write(). The sink may block (the Python bridge takes
// the GIL), so write() must never be called while holding a lock that a thread holding the GIL
// may wait for (a connection's or stream's mutex, the CQ poller's poll_mu_...): log after
// unlocking. enabled() is one relaxed atomic load, for the hot path.
#pragma once

#include <atomic>
#include <string>

namespace rdmaxfer::log {

// Python logging's level numbers.
enum class Level { kDebug = 10, kInfo = 20, kWarning = 30, kError = 40 };

// Receives every message at or above the threshold. Must be safe from any thread.
using Sink = void (*)(Level level, const std::string& message);

namespace detail {
// The least level the sink wants; above kError (nothing) until a sink is installed.
inline std::atomic<int> threshold{100};
}  // namespace detail

// True when a message of `level` would reach the sink (so building it is worth it).
inline bool enabled(Level level) {
  return static_cast<int>(level) >= detail::threshold.load(std::memory_order_relaxed);
}

// Hands `message` to the sink when enabled(level); dropped otherwise or without a sink.
void write(Level level, const std::string& message);

// Installs the sink (nullptr: none) and the least level it wants (a Level number, or above
// kError for nothing). Called by the bindings.
void set_sink(Sink sink, int threshold);
// Updates the least level the sink wants (the Python logger's effective level changed).
void set_threshold(int threshold);

}  // namespace rdmaxfer::log
